// SafeRegex (reward_internal.h): std::regex ECMAScript, matched without a recursion as deep as the
// text, so that a long response cannot overflow the stack of the thread that scores it.
//
// Why: the regex verifier matches patterns from configs and labels against responses of any length;
// a crash there would stop the whole run, while a too-long text is just that sample's error.
#include <string>
#include <utility>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

size_t digits_at(std::string_view p, size_t i) {
  size_t n = 0;
  while (i + n < p.size() && p[i + n] >= '0' && p[i + n] <= '9') ++n;
  return n;
}

// A back-reference (\N) or a counted repeat ({n}, {n,}, {n,m}) whose number has more digits than
// an int holds: libstdc++'s compiler reads it into a long without a bound (signed overflow, UB).
// Such a number would be an error anyway (no such group; more states than the regex allows).
bool has_huge_number(std::string_view p) {
  constexpr size_t kMaxDigits = 9;
  bool in_class = false;  // inside [...], where a brace is a plain character
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      if (digits_at(p, i + 1) > kMaxDigits) return true;
      ++i;  // the escaped character
    } else if (in_class) {
      in_class = p[i] != ']';
    } else if (p[i] == '[') {
      in_class = true;
    } else if (p[i] == '{') {
      const size_t n = digits_at(p, i + 1);  // read before the brace's syntax is checked
      const size_t after = i + 1 + n;
      if (n > kMaxDigits) return true;
      if (n > 0 && after < p.size() && p[after] == ',' && digits_at(p, after + 1) > kMaxDigits)
        return true;
    }
  }
  return false;
}

}  // namespace

Result<SafeRegex> SafeRegex::compile(const std::string& pattern) {
  if (has_huge_number(pattern))
    return Status::Error("pattern '" + excerpt(pattern) +
                         "' is not a valid regex: a back-reference or repeat count over 9 digits");
  try {
    std::regex plain(pattern, std::regex::ECMAScript);
#if defined(__GLIBCXX__)
    try {
      // libstdc++'s breadth-first executor; it refuses back-references.
      return SafeRegex(
          std::regex(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial),
          /*backtracking=*/false);
    } catch (const std::regex_error&) {
    }
#endif
    return SafeRegex(std::move(plain), /*backtracking=*/true);
  } catch (const std::regex_error& e) {
    return Status::Error("pattern '" + excerpt(pattern) + "' is not a valid regex: " + e.what());
  }
}

Result<bool> SafeRegex::search(std::string_view text) const {
  if (backtracking_ && text.size() > kMaxBacktrackingBytes) {
    return Status::Error("the response has " + std::to_string(text.size()) +
                         " bytes; a pattern with back-references is matched on at most " +
                         std::to_string(kMaxBacktrackingBytes));
  }
  try {
    return std::regex_search(text.begin(), text.end(), re_);
  } catch (const std::regex_error& e) {
    return Status::Error(std::string("regex search failed: ") + e.what());
  }
}

}  // namespace miles::reward
