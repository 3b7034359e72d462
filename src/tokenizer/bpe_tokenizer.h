// A BPE tokenizer assembled from parts, whatever file it came from.
//
// Why a spec: tokenizer.json and GGUF metadata describe the same pipeline — added tokens, a
// normalizer, pre-tokenizers, a BPE model, special tokens around the sequence, a decoder — in
// different spellings. Each reader (hf_tokenizer_json.cc, gguf_tokenizer.cc) validates its own
// spelling and fills a BpeTokenizerSpec; one implementation runs it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "miles/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace miles::tokenizer {

struct BpeTokenizerSpec {
  // Per id, [vocab size]: the entry as stored (token_text) and the bytes it decodes to, and when
  // the decoder treats the first token of a sequence differently (Metaspace drops its replacement
  // characters, Strip after Fuse its leading ones), the bytes of each id in that place.
  std::vector<std::string> token_text;
  std::vector<std::string> token_bytes;
  std::vector<std::string> first_token_bytes;  // empty: as token_bytes
  // The BPE model's view: (token as the model sees it, id), merges in rank order, options.
  std::vector<std::pair<std::string, int32_t>> model_vocab;
  std::vector<BpeMerge> merges;
  BpeOptions options;
  Normalizer normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<AddedToken> added_tokens;
  AddedTokenMatcher::Strategy added_strategy = AddedTokenMatcher::Strategy::kLeftmostLongest;
  std::vector<int32_t> prefix, suffix;  // added around the ids when add_special
  int32_t bos_id = -1, eos_id = -1;
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerSpec spec);

}  // namespace miles::tokenizer
