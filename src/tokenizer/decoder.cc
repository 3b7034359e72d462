// decode_token: HF's decoder chain over one token (see decoder.h).
#include "tokenizer/decoder.h"

#include <string_view>

namespace miles::tokenizer {
namespace {

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t prev = 0;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, prev)) {
    out.append(s, prev, at - prev);
    out.append(to);
    prev = at + from.size();
  }
  out.append(s, prev);
  return out;
}

// <0xNN> -> the byte NN, as HF's ByteFallback reads it (two hex digits, either case).
bool fallback_byte(const std::string& t, char* byte) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return false;
  *byte = static_cast<char>(hi * 16 + lo);
  return true;
}

std::string strip(const std::string& s, const std::string& c, int start, int stop) {
  size_t begin = 0, end = s.size();
  for (int k = 0; k < start && s.compare(begin, c.size(), c) == 0 && begin < end; ++k)
    begin += c.size();
  for (int k = 0;
       k < stop && end >= begin + c.size() && s.compare(end - c.size(), c.size(), c) == 0; ++k)
    end -= c.size();
  return s.substr(begin, end - begin);
}

}  // namespace

std::string decode_token(const std::vector<DecoderStep>& steps, const std::string& token,
                         bool first) {
  std::string t = token;
  bool fused = false;
  for (const DecoderStep& s : steps) {
    switch (s.kind) {
      case DecoderStep::Kind::kReplace:
        t = replace_all(t, s.from, s.to);
        break;
      case DecoderStep::Kind::kByteFallback: {
        char b;
        if (fallback_byte(t, &b)) t.assign(1, b);
        break;
      }
      case DecoderStep::Kind::kFuse:
        fused = true;
        break;
      case DecoderStep::Kind::kStrip:
        // After Fuse the text is one token: only its start is this token's business.
        if (!fused) {
          t = strip(t, s.from, s.start, s.stop);
        } else if (first) {
          t = strip(t, s.from, s.start, 0);
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        t = replace_all(t, s.replacement, first && s.prepend ? "" : " ");
        break;
    }
  }
  return t;
}

}  // namespace miles::tokenizer
