// SplitRegex: Oniguruma as HF `tokenizers` runs it, with the scanners as fast paths (see regex.h).
#include "tokenizer/regex.h"

#include <oniguruma.h>
#include <spdlog/spdlog.h>

#include <mutex>

#include "miles/check.h"
#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

void init_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    MILES_CHECK(onig_initialize(encodings, 1) == ONIG_NORMAL, "Oniguruma failed to initialize");
  });
}

// One match region per thread, reused across searches.
OnigRegion* thread_region() {
  struct Holder {
    OnigRegion* r = onig_region_new();
    ~Holder() { onig_region_free(r, 1); }
  };
  thread_local Holder h;
  return h.r;
}

// Length of the code point starting with lead byte b of well-formed UTF-8.
size_t utf8_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Index of the first byte that is not part of well-formed UTF-8, or text.size().
size_t first_invalid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    const int len = unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
    if (cp == unicode::kInvalid) return i;
    i += len;
  }
  return text.size();
}

}  // namespace

Result<std::shared_ptr<const SplitRegex>> SplitRegex::compile(std::string_view pattern,
                                                              Engine engine) {
  std::shared_ptr<SplitRegex> re(new SplitRegex());
  re->pattern_ = std::string(pattern);
  if (engine == Engine::kFastest) {
    re->scanner_ = pattern_from_regex(pattern);
    if (pattern == R"(\p{N})") re->run_max_ = 1;
    if (pattern == R"(\p{N}{1,3})") re->run_max_ = 3;
    if (pattern == R"(\p{N}+)") re->run_max_ = SIZE_MAX;
  }
  if (re->fast()) return std::shared_ptr<const SplitRegex>(std::move(re));
  init_oniguruma();
  regex_t* reg = nullptr;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(re->pattern_.data());
  const int rc = onig_new(&reg, begin, begin + re->pattern_.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    return Status::Error("regex \"" + re->pattern_ +
                         "\" does not compile in Oniguruma: " + reinterpret_cast<char*>(message));
  }
  re->onig_ = reg;
  return std::shared_ptr<const SplitRegex>(std::move(re));
}

SplitRegex::~SplitRegex() {
  if (onig_) onig_free(static_cast<regex_t*>(onig_));
}

void SplitRegex::find_parts(std::string_view text, std::vector<Part>& out) const {
  if (scanner_) {
    std::vector<Span> spans;
    find_matches(*scanner_, text, spans);
    for (const Span& s : spans) out.push_back({s, true});
    return;
  }
  if (run_max_ > 0) {
    number_runs(text, out);
    return;
  }
  if (first_invalid(text) == text.size()) {
    onig_parts(text, out);
    return;
  }
  // Ill-formed bytes become U+FFFD in a copy; the parts found there map back to the text (every
  // part boundary in the copy is a code point boundary, and each maps to one in the text).
  std::string clean;
  std::vector<size_t> to_text;  // [clean.size() + 1] byte offset in text
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const int len = unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
    if (cp == unicode::kInvalid) {
      clean += "\xEF\xBF\xBD";
      to_text.insert(to_text.end(), 3, i);
    } else {
      clean.append(text.substr(i, len));
      for (int k = 0; k < len; ++k) to_text.push_back(i);
    }
    i += len;
  }
  to_text.push_back(text.size());
  const size_t first = out.size();
  onig_parts(clean, out);
  for (size_t k = first; k < out.size(); ++k) {
    out[k].span.begin = to_text[out[k].span.begin];
    out[k].span.end = to_text[out[k].span.end];
  }
}

// \p{N}, \p{N}{1,3} or \p{N}+: each run of number code points cut into matches of at most
// run_max_ (leftmost, greedy), the rest gaps.
void SplitRegex::number_runs(std::string_view text, std::vector<Part>& out) const {
  size_t gap = 0, match = 0, count = 0;  // open gap start; open match start and its length
  bool in_match = false;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const int len = unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
    const bool number = cp != unicode::kInvalid && (unicode::flags(cp) & unicode::kNumber);
    if (in_match && (!number || count == run_max_)) {
      out.push_back({{match, i}, true});
      in_match = false;
      gap = i;
    }
    if (number && !in_match) {
      if (gap < i) out.push_back({{gap, i}, false});
      in_match = true;
      match = i;
      count = 0;
    }
    count += number;
    i += len;
  }
  if (in_match) {
    out.push_back({{match, text.size()}, true});
  } else if (gap < text.size()) {
    out.push_back({{gap, text.size()}, false});
  }
}

// The `onig` crate's FindMatches over well-formed UTF-8, then HF's find_matches around it.
void SplitRegex::onig_parts(std::string_view text, std::vector<Part>& out) const {
  auto* reg = static_cast<regex_t*>(onig_);
  OnigRegion* region = thread_region();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t last_end = 0, prev = 0;
  bool skip_next_empty = false;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int rc = onig_search(reg, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (rc == ONIG_MISMATCH) break;
    if (rc < 0) {  // a limit of Oniguruma's (HF panics here): the rest stays one piece
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, rc);
      spdlog::error(
          "tokenizer: regex \"{}\" failed on a text of {} bytes ({}); its rest is one piece",
          pattern_, text.size(), reinterpret_cast<char*>(message));
      break;
    }
    const auto s = static_cast<size_t>(region->beg[0]);
    const auto e = static_cast<size_t>(region->end[0]);
    last_end = e;
    if (s == e) {
      last_end += e < text.size() ? utf8_len(static_cast<uint8_t>(text[e])) : 1;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    if (prev != s) out.push_back({{prev, s}, false});
    out.push_back({{s, e}, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({{prev, text.size()}, false});
}

}  // namespace miles::tokenizer
