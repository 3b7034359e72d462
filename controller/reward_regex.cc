// SafeRegex (reward_internal.h): std::regex ECMAScript, matched without a recursion as deep as the
// text, so that a long response cannot overflow the stack of the thread that scores it.
//
// Why: the regex verifier matches patterns from configs and labels against responses of any length;
// a crash there would stop the whole run, while a too-long text is just that sample's error.
#include <string>
#include <utility>

#include "controller/reward_internal.h"

namespace miles::reward {

Result<SafeRegex> SafeRegex::compile(const std::string& pattern) {
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
