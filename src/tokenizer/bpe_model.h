// The BPE model: one pre-tokenized word in, its token ids out, exactly as HF's BPE model (and
// llama.cpp's BPE session) computes them.
//
// Why this shape: the word starts as one symbol per byte (byte-level vocabularies, stored here as
// raw bytes instead of GPT-2's printable stand-ins) or per UTF-8 character, then the adjacent pair
// with the lowest merge rank is merged, leftmost first on ties, until no pair merges — HF's heap
// with (rank, position) keys. Merges are looked up by id pair in an open-addressing table, and
// finished words go into a bounded cache shared by all threads (sharded locks), because real text
// repeats its words: most of the work of a long text is cache hits.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace miles::tokenizer {

struct BpeMerge {
  int32_t left, right, result;  // ids; the rank is the merge's index in the list
};

struct BpeOptions {
  bool byte_level = true;      // symbols start as bytes (else as UTF-8 characters)
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens
  bool ignore_merges = false;  // a word that is a token is that token, merges or not
  bool newline_words_whole = false;  // the same for words of newlines only (llama.cpp, Gemma 4)
  int32_t unk_id = -1;         // unknown characters become this token (-1: they are dropped)
  bool fuse_unk = false;       // consecutive unknowns become one
};

// Open addressing from an id pair to (rank, result).
class MergeTable {
 public:
  void build(const std::vector<BpeMerge>& merges);  // later duplicates override earlier ones
  // Rank and result of merging (left, right); false when no such merge.
  bool find(int32_t left, int32_t right, uint32_t* rank, int32_t* result) const {
    if (slots_.empty()) return false;
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        *result = s.result;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t result = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t hash(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // vocab: (token as the model sees it — raw bytes when byte_level — , id). Later duplicates of a
  // string do not replace the first. merges in rank order, by id.
  BpeModel(std::vector<std::pair<std::string, int32_t>> vocab, const std::vector<BpeMerge>& merges,
           BpeOptions options);

  // Appends the ids of one word (non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // The id of a token string, or -1.
  int32_t token_id(std::string_view token) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kCacheWordsPerShard = 2048;  // at most 131072 words
  static constexpr size_t kMaxCachedWordBytes = 256;

  // Initial symbols of a word (ids and byte lengths), HF's merge_word before merging.
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids,
                       std::vector<uint32_t>& lens) const;
  void merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>& lens,
                     std::vector<int32_t>& out) const;

  BpeOptions options_;
  Vocab vocab_;
  MergeTable merges_;
  std::array<int32_t, 256> byte_ids_;      // byte-level: id of each single byte, -1 if none
  std::array<int32_t, 256> fallback_ids_;  // id of <0xNN>, -1 if none
  std::unique_ptr<CacheShard[]> cache_;
};

}  // namespace miles::tokenizer
