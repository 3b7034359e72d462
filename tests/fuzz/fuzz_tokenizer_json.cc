// libFuzzer target: arbitrary bytes through the tokenizer.json reader; an accepted tokenizer
// encodes a few awkward strings (with and without special-token parsing and added specials) and
// decodes the ids back, plus a run of raw ids, so that a reader that lets an inconsistent file
// through (an id past the vocabulary, a merge result that is not a token) shows up as an ASan
// report or a MILES_CHECK abort.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "miles/check.h"
#include "miles/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = miles::parse_hf_tokenizer(std::string_view(reinterpret_cast<const char*>(data), size),
                                     "fuzz.json");
  if (!r.ok()) return 0;
  const miles::Tokenizer& t = **r;
  const int32_t vocab = t.vocab_size();
  static const char* const kTexts[] = {"",
                                       "Hello world",
                                       "  \t\n\r\n 12345 it's 'LL",
                                       "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\xa6\x99",
                                       "e\xcc\x81 \xef\xac\xaa",
                                       "<|im_start|>x<s></s>[MASK]",
                                       "\xff\xc3(\x80 bytes",
                                       "\xe2\x96\x81"
                                       "a, b! \xef\xbc\xa1 <0x41> A\xcc\x8a 1,234"};
  for (const char* text : kTexts) {
    for (const bool parse_special : {true, false}) {
      const std::vector<int32_t> ids = t.encode_with(text, {parse_special, parse_special});
      for (const int32_t id : ids) MILES_CHECK(id >= 0 && id < vocab, "encode gave a bad id");
      volatile size_t sink = t.decode(ids).size();
      (void)sink;
    }
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < vocab && id < 512; ++id) all.push_back(id);
  volatile size_t sink = t.decode(all).size();
  (void)sink;
  return 0;
}
