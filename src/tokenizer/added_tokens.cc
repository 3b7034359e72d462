// AddedTokenMatcher: a byte trie over the added tokens and the two cutting strategies (see
// added_tokens.h).
//
// Why a trie with a first-byte table: most text holds no added token at all, so the common case
// is one table lookup per byte; a position whose byte starts some token walks the trie once and
// remembers the longest token it passed.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

// Flags of the code point ending right before byte offset `end` (0 at the start).
uint8_t flags_before(std::string_view s, size_t end, size_t* start) {
  size_t b = end;
  while (b > 0 && end - b < 4) {
    --b;
    if ((static_cast<uint8_t>(s[b]) & 0xC0) != 0x80) break;
  }
  uint32_t cp;
  const int len = unicode::decode_utf8(s.data() + b, s.size() - b, &cp);
  if (b + static_cast<size_t>(len) != end) {  // ill-formed: the last byte alone
    b = end - 1;
    cp = unicode::kInvalid;
  }
  *start = b;
  return unicode::flags(cp);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, Strategy strategy)
    : tokens_(std::move(tokens)), strategy_(strategy) {
  trie_.emplace_back();
  for (int32_t t = 0; t < static_cast<int32_t>(tokens_.size()); ++t) {
    const std::string& c = tokens_[t].content;
    if (c.empty()) continue;
    starts_[static_cast<uint8_t>(c[0])] = true;
    int32_t node = 0;
    for (const char ch : c) {
      const auto b = static_cast<uint8_t>(ch);
      auto& next = trie_[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::pair<uint8_t, int32_t>(b, -1));
      if (it == next.end() || it->first != b) {
        const auto child = static_cast<int32_t>(trie_.size());
        it = next.insert(it, {b, child});
        trie_.emplace_back();  // invalidates `next`; `it` is not used after this
        node = child;
      } else {
        node = it->second;
      }
    }
    if (trie_[node].token < 0) trie_[node].token = t;  // the first of equal contents wins
  }
  for (int32_t t = 0; t < static_cast<int32_t>(tokens_.size()); ++t)
    if (!tokens_[t].content.empty()) by_length_.push_back(t);
  std::stable_sort(by_length_.begin(), by_length_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].content.size() > tokens_[b].content.size();
  });
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t i) const {
  int32_t node = 0, best = -1;
  for (size_t k = i; k < text.size(); ++k) {
    const auto& next = trie_[node].next;
    const auto b = static_cast<uint8_t>(text[k]);
    auto it = std::lower_bound(next.begin(), next.end(), std::pair<uint8_t, int32_t>(b, -1));
    if (it == next.end() || it->first != b) break;
    node = it->second;
    if (trie_[node].token >= 0) best = trie_[node].token;
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special,
                              std::vector<Segment>& out) const {
  if (text.empty()) return;
  if (tokens_.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  if (strategy_ == Strategy::kLeftmostLongest) {
    split_leftmost_longest(text, parse_special, out);
  } else {
    split_longest_first(text, parse_special, out);
  }
}

// HF AddedVocabulary::find_matches.
void AddedTokenMatcher::split_leftmost_longest(std::string_view text, bool parse_special,
                                               std::vector<Segment>& out) const {
  size_t start_offset = 0;  // end of the last segment emitted
  for (size_t i = 0; i < text.size();) {
    if (!starts_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const int32_t t = longest_at(text, i);
    if (t < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[t];
    size_t start = i, stop = i + tok.content.size();
    i = stop;  // a skipped match still consumes its text
    if (tok.special && !parse_special) continue;
    if (tok.single_word) {
      size_t unused;
      const bool word_before = start > 0 && (flags_before(text, start, &unused) & unicode::kWord);
      uint32_t cp = unicode::kInvalid;
      if (stop < text.size()) unicode::decode_utf8(text.data() + stop, text.size() - stop, &cp);
      const bool word_after = stop < text.size() && (unicode::flags(cp) & unicode::kWord);
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > start_offset) {
        size_t prev;
        if (!(flags_before(text, b, &prev) & unicode::kSpace)) break;
        b = prev;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        uint32_t cp;
        const int len = unicode::decode_utf8(text.data() + stop, text.size() - stop, &cp);
        if (!(unicode::flags(cp) & unicode::kSpace)) break;
        stop += len;
      }
      i = stop;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

// llama.cpp tokenizer_st_partition: longest token first, every occurrence in every plain stretch.
void AddedTokenMatcher::split_longest_first(std::string_view text, bool parse_special,
                                            std::vector<Segment>& out) const {
  // Which tokens occur anywhere: only those can split a stretch.
  std::vector<bool> present(tokens_.size(), false);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!starts_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0;
    for (size_t k = i; k < text.size(); ++k) {
      const auto& next = trie_[node].next;
      const auto b = static_cast<uint8_t>(text[k]);
      auto it = std::lower_bound(next.begin(), next.end(), std::pair<uint8_t, int32_t>(b, -1));
      if (it == next.end() || it->first != b) break;
      node = it->second;
      if (trie_[node].token >= 0) present[trie_[node].token] = true;
    }
  }
  std::vector<Segment> segs{{0, text.size(), -1}};
  for (const int32_t t : by_length_) {
    const AddedToken& tok = tokens_[t];
    if (!present[t] || (tok.special && !parse_special)) continue;
    std::vector<Segment> next;
    next.reserve(segs.size());
    for (const Segment& s : segs) {
      if (s.id >= 0) {
        next.push_back(s);
        continue;
      }
      size_t prev = s.begin;
      const std::string_view stretch = text.substr(0, s.end);
      for (size_t at = stretch.find(tok.content, s.begin); at != std::string_view::npos;
           at = stretch.find(tok.content, at + tok.content.size())) {
        if (at > prev) next.push_back({prev, at, -1});
        next.push_back({at, at + tok.content.size(), tok.id});
        prev = at + tok.content.size();
      }
      if (prev < s.end) next.push_back({prev, s.end, -1});
    }
    segs = std::move(next);
  }
  out.insert(out.end(), segs.begin(), segs.end());
}

}  // namespace miles::tokenizer
