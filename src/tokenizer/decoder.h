// Decoding: HF's decoders (Replace, ByteFallback, Fuse, Strip, Metaspace) as the bytes of each id.
//
// Why per id: HF decodes a list of token strings through a chain of decoders; every chain this
// supports works token by token until Fuse joins them, and what follows Fuse (Strip) touches only
// the start of the text. So the chain is run once per id at load time, twice where the first
// token of a sequence decodes differently (Metaspace drops its replacement characters there,
// Strip after Fuse its leading ones), and decoding is a concatenation. ByteFallback gives the raw
// bytes of <0xNN> tokens, as miles' decoding is byte-exact everywhere (HF shows U+FFFD for bytes
// that do not form UTF-8; the bytes are equal wherever they do). Chains of another shape are
// refused when the tokenizer is read.
#pragma once

#include <string>
#include <vector>

namespace miles::tokenizer {

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from, to;     // kReplace: a literal; kStrip: `from` is the character removed
  int start = 0, stop = 0;  // kStrip: how many leading / trailing `from` characters at most
  std::string replacement;  // kMetaspace: the character that stands for a space
  bool prepend = true;      // kMetaspace: prepend_scheme is not "never"
};

// The bytes of a token after the chain `steps`, as the first token of the sequence or not.
std::string decode_token(const std::vector<DecoderStep>& steps, const std::string& token,
                         bool first);

}  // namespace miles::tokenizer
