// The pre-tokenizer a GGUF vocabulary names (tokenizer.ggml.pre), as llama.cpp defines each name.
//
// Why a table: a GGUF file does not spell its pre-tokenizer out, it names it, and the meaning of
// every name is llama.cpp's: a list of regexes, each cutting every piece the previous one left
// into its matches and the gaps between them (HF's Split with behavior Isolated), plus a few
// options. The table is data; the regexes run through the same SplitRegex as tokenizer.json
// patterns (regex.h). Names whose splitting llama.cpp does in hand-written code, or whose
// tokenizer needs steps we do not implement, are refused with the reason.
#pragma once

#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles::tokenizer {

struct GgufPreTokenizer {
  std::vector<std::string_view> regexes;  // applied in order, each an Isolated split
  bool ignore_merges = false;             // a word that is a token is that token
  bool add_bos = false;                   // llama.cpp's default for tokenizer.ggml.add_bos_token
  // SentencePiece-style BPE (Gemma 4, Sarvam): spaces become U+2581 before splitting, the BPE runs
  // on raw UTF-8 (no byte-level alphabet; <0xNN> tokens for unknown bytes) and the tokens decode
  // with U+2581 as a space.
  bool escaped_spaces = false;
  bool newline_words_whole = false;  // a word of newlines only that is a token is that token
};

// The definition of `name` ("" is llama.cpp's "default"), or an error saying why not.
Result<GgufPreTokenizer> gguf_pre_tokenizer(std::string_view name);
// Every name the table holds, refused ones included (tests).
std::vector<std::string_view> gguf_pre_tokenizer_names();

}  // namespace miles::tokenizer
