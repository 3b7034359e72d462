// SentencePiece-style (BPE by score) tokenizers from GGUF "llama" vocabularies, as llama.cpp runs
// them.
//
// Why llama.cpp's algorithm and not SentencePiece's: a GGUF file carries only pieces, scores and
// token types, and the ids users compare against are llama.cpp's (its tokenizer test vectors).
// llama.cpp escapes spaces to U+2581, adds one space in front of text that starts the sequence or
// follows an added token, starts from one symbol per UTF-8 character and repeatedly merges the
// adjacent pair whose concatenation is a vocabulary entry with the highest score (leftmost on
// ties); a final symbol that is not an entry becomes its bytes' <0xNN> tokens.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "miles/tokenizer.h"

namespace miles::tokenizer {

// llama.cpp token types (tokenizer.ggml.token_type).
enum GgufTokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

// Tokens llama.cpp matches in the text before the vocabulary's own algorithm runs (control,
// user-defined and unknown ones): added tokens.
inline bool is_added_type(int32_t type) {
  return type == kTokenControl || type == kTokenUserDefined || type == kTokenUnknown;
}

struct SpmSpec {
  std::vector<std::string> pieces;  // [vocab] as stored, spaces as U+2581
  std::vector<float> scores;        // [vocab]
  std::vector<int32_t> types;       // [vocab] GgufTokenType
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;
};

std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmSpec spec);

}  // namespace miles::tokenizer
