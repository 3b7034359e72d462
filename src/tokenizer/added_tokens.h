// Added tokens (<|im_start|>, <think>, ...): found in the raw text before anything else runs.
//
// Why a separate matcher: these tokens bypass normalization, pre-tokenization and BPE, so the text
// is first cut into added tokens and plain stretches. The two reference implementations cut
// differently when added tokens overlap, and each format follows its own: HF tokenizer.json takes
// the leftmost match, longest at that position, non-overlapping (aho-corasick LeftmostLongest,
// then HF's single_word / lstrip / rstrip rules); llama.cpp (GGUF) takes the longest token first
// and splits every stretch at all its occurrences before trying shorter tokens.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace miles::tokenizer {

struct AddedToken {
  std::string content;  // raw bytes matched in the text (normalized form for `normalized` ones)
  int32_t id = -1;
  bool special = false;      // skipped when special tokens are not parsed
  bool single_word = false;  // only when not inside a word (Rust regex \w on either side)
  bool lstrip = false;       // also takes the whitespace on its left
  bool rstrip = false;       // also takes the whitespace on its right
  bool normalized = false;   // matched in the normalized text (HF), after plain ones
};

// A stretch of text: an added token (id >= 0) or plain text (id -1).
struct Segment {
  size_t begin, end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  enum class Strategy { kLeftmostLongest, kLongestFirst };

  AddedTokenMatcher() = default;
  AddedTokenMatcher(std::vector<AddedToken> tokens, Strategy strategy);
  bool empty() const { return tokens_.empty(); }

  // Appends the segments of text[begin, end) (they tile it, in order). parse_special false leaves
  // special tokens as plain text (HF split_special_tokens, llama.cpp parse_special=false).
  void split(std::string_view text, bool parse_special, std::vector<Segment>& out) const;

 private:
  // The longest token starting at text[i], or -1 (index into tokens_).
  int32_t longest_at(std::string_view text, size_t i) const;
  void split_leftmost_longest(std::string_view text, bool parse_special,
                              std::vector<Segment>& out) const;
  void split_longest_first(std::string_view text, bool parse_special,
                           std::vector<Segment>& out) const;

  struct Node {
    int32_t token = -1;                             // index into tokens_ ending here
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
  };
  std::vector<AddedToken> tokens_;
  Strategy strategy_ = Strategy::kLeftmostLongest;
  std::vector<Node> trie_;          // trie_[0] is the root
  std::array<bool, 256> starts_{};  // some token starts with this byte
  std::vector<int32_t> by_length_;  // token indices, longest first (kLongestFirst)
};

}  // namespace miles::tokenizer
