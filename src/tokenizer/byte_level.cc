// GPT-2's bytes_to_unicode and its inverse (see byte_level.h).
#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

bool printable(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

struct Tables {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // stand-ins are all below U+0200; -1: none
  Tables() {
    to_byte.fill(-1);
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      to_char[b] = printable(b) ? b : 256 + n++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_level_char(uint8_t byte) { return tables().to_char[byte]; }

bool byte_level_decode(std::string_view token, std::string* bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    i += unicode::decode_utf8(token.data() + i, token.size() - i, &cp);
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(t.to_byte[cp]));
  }
  *bytes = std::move(out);
  return true;
}

}  // namespace miles::tokenizer
