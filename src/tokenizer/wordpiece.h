// WordPiece tokenizers from GGUF "bert" vocabularies (BERT / BGE-style embedding models), as
// llama.cpp runs them.
//
// Why llama.cpp's algorithm: a GGUF carries only the pieces (llama.cpp's converter marks a word's
// first piece with U+2581 instead of WordPiece's "##" on the others) and the ids users compare
// against are llama.cpp's (its bert-bge test vectors). Text becomes words: every code point is
// reduced to the first code point of its canonical decomposition and lowercased (llama.cpp's
// tables: wordpiece_tables.h), whitespace ends a word, control characters (and NUL, U+FFFD) are
// dropped, punctuation, ASCII symbols and CJK ideographs are words of their own. Each word, marked
// with U+2581, is cut from the left into the longest vocabulary entries; a word with a position no
// entry matches becomes one [UNK].
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "miles/tokenizer.h"

namespace miles::tokenizer {

struct WordPieceSpec {
  std::vector<std::string> pieces;  // [vocab] as stored (word starts marked with U+2581)
  std::vector<int32_t> types;       // [vocab] GgufTokenType (spm_tokenizer.h)
  int32_t unk_id = -1;
  int32_t bos_id = -1, eos_id = -1;  // [CLS] and [SEP]
  bool add_bos = true, add_eos = true;
};

std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(WordPieceSpec spec);

// The words of `text` as llama.cpp's WordPiece pre-processing makes them (exposed for tests).
std::vector<std::string> wordpiece_words(std::string_view text);

}  // namespace miles::tokenizer
