// libFuzzer target: arbitrary bytes through GgufFile::parse; an accepted file has every metadata
// value touched and every tensor with a decoder dequantised in full, so a count, length or offset
// check that lets a lie through becomes an ASan report (or an allocation past -rss_limit_mb). Its
// vocabulary, where it has one, becomes a tokenizer (BPE, SentencePiece, WordPiece) that encodes
// and decodes a fixed text with every kind of character its pre-processing treats apart.
#include <cstddef>
#include <cstdint>

#include "miles/gguf.h"
#include "miles/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = miles::GgufFile::parse(data, size, "fuzz.gguf", nullptr);
  if (!f.ok()) return 0;
  volatile uint64_t sink = 0;
  for (const auto& [key, v] : f->metadata()) {
    sink = sink + key.size() + v.s.size() + v.ints.size() + v.floats.size() + v.strings.size();
    (void)f->get_float(key);
    (void)f->get_strings(key);
  }
  for (const miles::GgufTensorInfo& t : f->tensors()) {
    for (uint64_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
    auto d = f->dequantize(t);
    if (!d.ok()) continue;
    const float* p = d->data<float>();
    for (int64_t i = 0; i < d->numel(); ++i) sink = sink + static_cast<uint64_t>(p[i] == p[i]);
  }
  if (auto t = miles::gguf_tokenizer(*f); t.ok()) {
    const auto ids =
        (*t)->encode_with("Hello, World! \xC3\x84pfel \xE4\xB8\xAD\xE6\x96\x87 \t 123 <s>",
                          {/*add_special=*/true, /*parse_special=*/true});
    sink = sink + ids.size() + (*t)->decode(ids).size();
  }
  return 0;
}
