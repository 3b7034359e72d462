// Normalizer: HF's normalizers as string functions (see normalizer.h).
//
// Each step follows HF's NormalizedString operation: Replace rewrites every match of its pattern
// (a String pattern is a literal, matched left to right without overlap; a Regex pattern runs
// through SplitRegex, so as HF's find_iter, empty matches included), Prepend adds its prefix to a
// non-empty text, Strip removes White_Space code points at either end.
#include "tokenizer/normalizer.h"

#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

std::string replace_literal(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from, prev)) {
    out.append(text.substr(prev, at - prev));
    out.append(to);
    prev = at + from.size();
  }
  out.append(text.substr(prev));
  return out;
}

std::string replace_regex(std::string_view text, const SplitRegex& re, std::string_view to) {
  std::vector<Part> parts;
  re.find_parts(text, parts);
  std::string out;
  out.reserve(text.size());
  for (const Part& p : parts) {
    if (p.is_match) {
      out.append(to);
    } else {
      out.append(text.substr(p.span.begin, p.span.end - p.span.begin));
    }
  }
  return out;
}

bool is_space(std::string_view text, size_t i, int* len) {
  uint32_t cp;
  *len = unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
  return cp != unicode::kInvalid && (unicode::flags(cp) & unicode::kSpace);
}

std::string strip(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    int len;
    while (begin < end && is_space(text, begin, &len)) begin += len;
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;  // the start of the last code point
      while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
      int len;
      if (!is_space(text, start, &len) || start + len != end) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

}  // namespace

std::string_view Normalizer::run(std::string_view text, std::string& buffer) const {
  std::string_view cur = text;
  std::string next;
  for (const NormalizerStep& s : steps_) {
    switch (s.kind) {
      case NormalizerStep::Kind::kNfc:
        if (unicode::is_nfc_quick(cur)) continue;
        next = unicode::to_nfc(cur);
        break;
      case NormalizerStep::Kind::kNfd:
        next = unicode::normalize(cur, unicode::NormalForm::kNfd);
        break;
      case NormalizerStep::Kind::kNfkc:
        next = unicode::normalize(cur, unicode::NormalForm::kNfkc);
        break;
      case NormalizerStep::Kind::kNfkd:
        next = unicode::normalize(cur, unicode::NormalForm::kNfkd);
        break;
      case NormalizerStep::Kind::kLowercase:
        next = unicode::to_lower(cur);
        break;
      case NormalizerStep::Kind::kReplace:
        next = s.regex ? replace_regex(cur, *s.regex, s.content)
                       : replace_literal(cur, s.literal, s.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (cur.empty()) continue;
        next = s.literal;
        next.append(cur);
        break;
      case NormalizerStep::Kind::kStrip:
        next = strip(cur, s.strip_left, s.strip_right);
        break;
    }
    buffer.swap(next);
    cur = buffer;
  }
  return cur;
}

}  // namespace miles::tokenizer
