// BpeModel: initial symbols, the merge loop and the word cache (see bpe_model.h).
//
// The merge loop is HF's Word::merge_all without dropout: a min-heap of candidate merges keyed by
// (rank, left symbol position); a popped candidate is stale when its left symbol was absorbed or
// the pair it names no longer produces the same token, and is skipped. Symbols keep the slot of
// their left part, so position order is text order and ties go to the leftmost pair.
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <bit>
#include <cstdio>

#include "miles/check.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

struct Candidate {
  uint32_t rank;
  uint32_t pos;
  int32_t result;
  // std heap functions build a max-heap: "less" means lower priority.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void MergeTable::build(const std::vector<BpeMerge>& merges) {
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  for (size_t r = 0; r < merges.size(); ++r) {
    const uint64_t key = pack(merges[r].left, merges[r].right);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {
        s = {key, static_cast<uint32_t>(r), merges[r].result};
        break;
      }
    }
  }
}

BpeModel::BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
                   const std::vector<BpeMerge>& merges, BpeOptions options)
    : options_(options), cache_(new CacheShard[kCacheShards]) {
  vocab_.reserve(vocab.size());
  for (auto& [token, id] : vocab) vocab_.emplace(std::move(token), id);
  merges_.build(merges);
  byte_ids_.fill(-1);
  fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (options_.byte_level) {
      const std::string one(1, static_cast<char>(b));
      byte_ids_[b] = token_id(one);
    }
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    fallback_ids_[b] = token_id(name);
  }
}

int32_t BpeModel::token_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& ids,
                               std::vector<uint32_t>& lens) const {
  int32_t unk_len = 0;  // pending unknown (fuse_unk), HF's `unk`
  auto flush_unk = [&] {
    if (unk_len > 0) {
      ids.push_back(options_.unk_id);
      lens.push_back(static_cast<uint32_t>(unk_len));
      unk_len = 0;
    }
  };
  for (size_t i = 0; i < word.size();) {
    size_t len = 1;
    int32_t id;
    std::string_view unit;  // the unit as the vocabulary spells it
    std::string stand_in;
    if (options_.byte_level) {
      id = byte_ids_[static_cast<uint8_t>(word[i])];
      if (id < 0) {
        unicode::append_utf8(byte_level_char(static_cast<uint8_t>(word[i])), stand_in);
        unit = stand_in;
      }
    } else {
      uint32_t cp;
      len = static_cast<size_t>(unicode::decode_utf8(word.data() + i, word.size() - i, &cp));
      unit = word.substr(i, len);
      id = token_id(unit);
    }
    i += len;
    if (id >= 0) {
      flush_unk();
      ids.push_back(id);
      lens.push_back(static_cast<uint32_t>(len));
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (const char c : unit) all = all && fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (const char c : unit) {
          ids.push_back(fallback_ids_[static_cast<uint8_t>(c)]);
          lens.push_back(1);
        }
        continue;  // HF keeps a pending unknown pending across byte-fallback tokens
      }
    }
    if (options_.unk_id >= 0) {
      if (unk_len > 0 && !options_.fuse_unk) flush_unk();
      unk_len += static_cast<int32_t>(len);
    }
  }
  flush_unk();
}

void BpeModel::merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>& lens,
                             std::vector<int32_t>& out) const {
  const auto n = static_cast<uint32_t>(ids.size());
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<Candidate> heap;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (uint32_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  uint32_t rank;
  int32_t result;
  for (uint32_t i = 0; i + 1 < n; ++i)
    if (merges_.find(ids[i], ids[i + 1], &rank, &result)) heap.push_back({rank, i, result});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    const uint32_t p = top.pos;
    if (lens[p] == 0 || next[p] < 0) continue;
    const auto q = static_cast<uint32_t>(next[p]);
    if (!merges_.find(ids[p], ids[q], &rank, &result) || result != top.result) continue;
    ids[p] = top.result;
    lens[p] += lens[q];
    lens[q] = 0;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = static_cast<int32_t>(p);
    if (prev[p] >= 0 && merges_.find(ids[prev[p]], ids[p], &rank, &result)) {
      heap.push_back({rank, static_cast<uint32_t>(prev[p]), result});
      std::push_heap(heap.begin(), heap.end());
    }
    if (next[p] >= 0 && merges_.find(ids[p], ids[next[p]], &rank, &result)) {
      heap.push_back({rank, p, result});
      std::push_heap(heap.begin(), heap.end());
    }
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(ids[i]);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  MILES_CHECK(!word.empty());
  if (options_.ignore_merges ||
      (options_.newline_words_whole && word.find_first_not_of('\n') == std::string_view::npos)) {
    if (const int32_t id = token_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (options_.byte_level && word.size() == 1 && byte_ids_[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[StringHash{}(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->words.find(word);
    if (it != shard->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<uint32_t> lens;
  ids.clear();
  lens.clear();
  initial_symbols(word, ids, lens);
  const size_t first = out.size();
  merge_symbols(ids, lens, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->words.size() < kCacheWordsPerShard)
      shard->words.emplace(
          std::string(word),
          std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

}  // namespace miles::tokenizer
