// WordPiece (wordpiece.h): llama.cpp's pre-processing over its own Unicode tables, then greedy
// longest-match-first cutting of each word.
#include "tokenizer/wordpiece.h"

#include <algorithm>
#include <unordered_map>

#include "miles/check.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/wordpiece_tables.h"

namespace miles::tokenizer {

namespace {

using wordpiece::detail::Range;
constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581
enum : int32_t { kSpace = 1, kControl = 2, kPunct = 4, kSymbol = 8 };

// The value of the range holding cp, or `fallback`.
int32_t lookup(const Range* table, size_t n, uint32_t cp, int32_t fallback) {
  const Range* end = table + n;
  const Range* it =
      std::upper_bound(table, end, cp, [](uint32_t c, const Range& r) { return c < r.first; });
  if (it == table) return fallback;
  --it;
  return cp <= it->last ? it->value : fallback;
}

int32_t flags(uint32_t cp) {
  return lookup(wordpiece::detail::kFlags, wordpiece::detail::kFlagsSize, cp, 0);
}
uint32_t base_letter(uint32_t cp) {
  return static_cast<uint32_t>(
      lookup(wordpiece::detail::kNfd, wordpiece::detail::kNfdSize, cp, static_cast<int32_t>(cp)));
}
uint32_t to_lower(uint32_t cp) {
  return cp + static_cast<uint32_t>(
                  lookup(wordpiece::detail::kLower, wordpiece::detail::kLowerSize, cp, 0));
}

// BERT's CJK ideograph blocks, as llama.cpp (and HF's BertPreTokenizer) list them.
bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class WordPieceTokenizer final : public Tokenizer {
 public:
  explicit WordPieceTokenizer(WordPieceSpec s) : spec_(std::move(s)) {
    const auto n = static_cast<int32_t>(spec_.pieces.size());
    std::vector<AddedToken> added;
    for (int32_t id = 0; id < n; ++id) {
      lookup_[spec_.pieces[id]] = id;  // later ids win, as llama.cpp's token_to_id
      max_len_ = std::max(max_len_, spec_.pieces[id].size());
      if (is_added(id))
        added.push_back({spec_.pieces[id], id, spec_.types[id] != kTokenUserDefined});
    }
    added_ = AddedTokenMatcher(std::move(added), AddedTokenMatcher::Strategy::kLongestFirst);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    return encode_with(text, EncodeOptions{add_special, true});
  }

  std::vector<int32_t> encode_with(std::string_view text,
                                   const EncodeOptions& options) const override {
    std::vector<int32_t> ids;
    if (options.add_special && spec_.add_bos && spec_.bos_id >= 0) ids.push_back(spec_.bos_id);
    std::vector<Segment> segs;
    added_.split(text, options.parse_special, segs);
    for (const Segment& s : segs) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      for (const std::string& w : wordpiece_words(text.substr(s.begin, s.end - s.begin)))
        encode_word(w, ids);
    }
    if (options.add_special && spec_.add_eos && spec_.eos_id >= 0) ids.push_back(spec_.eos_id);
    return ids;
  }

  // llama.cpp's pieces: U+2581 as a space, the text's first space dropped.
  std::string decode_piece(int32_t prev_id, int32_t id) const override {
    MILES_CHECK(id >= 0 && id < vocab_size(), "token id outside the vocabulary");
    const std::string& p = spec_.pieces[id];
    if (is_added(id)) return p;
    std::string out;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, kWordStart.size(), kWordStart) == 0) {
        if (prev_id >= 0 || i > 0) out.push_back(' ');
        i += kWordStart.size();
      } else {
        out.push_back(p[i++]);
      }
    }
    return out;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(spec_.pieces.size()); }
  bool is_special(int32_t id) const override {
    const int32_t t = spec_.types[static_cast<size_t>(id)];
    return t == kTokenControl || t == kTokenUnknown || id == spec_.bos_id || id == spec_.eos_id;
  }
  int32_t bos_id() const override { return spec_.bos_id; }
  int32_t eos_id() const override { return spec_.eos_id; }
  std::string token_text(int32_t id) const override {
    MILES_CHECK(id >= 0 && id < vocab_size(), "token id outside the vocabulary");
    return spec_.pieces[id];
  }

 private:
  bool is_added(int32_t id) const { return is_added_type(spec_.types[id]); }

  // The word's pieces from the left, each the longest entry starting there; none: [UNK].
  void encode_word(const std::string& word, std::vector<int32_t>& ids) const {
    const std::string w = std::string(kWordStart) + word;
    const size_t first = ids.size();
    for (size_t i = 0; i < w.size();) {
      size_t j = std::min(w.size(), i + max_len_ + 1);
      for (; j > i; --j) {
        auto it = lookup_.find(w.substr(i, j - i));
        if (it == lookup_.end()) continue;
        ids.push_back(it->second);
        break;
      }
      if (j == i) {  // no entry starts here: the whole word is unknown
        ids.resize(first);
        break;
      }
      i = j;
    }
    if (ids.size() == first && spec_.unk_id >= 0) ids.push_back(spec_.unk_id);
  }

  WordPieceSpec spec_;
  std::unordered_map<std::string, int32_t> lookup_;
  size_t max_len_ = 0;
  AddedTokenMatcher added_;
};

}  // namespace

std::vector<std::string> wordpiece_words(std::string_view text) {
  std::vector<std::string> words(1);
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    i += unicode::decode_utf8(text.data() + i, text.size() - i, &cp);
    if (cp == unicode::kInvalid) cp = 0xFFFD;  // llama.cpp decodes a bad byte to U+FFFD
    cp = base_letter(cp);
    const int32_t f = flags(cp);
    if (f & kSpace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cp == 0 || cp == 0xFFFD || (f & kControl)) continue;
    const uint32_t lower = to_lower(cp);
    if ((f & kPunct) || (cp < 0x7F && (f & kSymbol)) || is_cjk(cp)) {
      if (!words.back().empty()) words.emplace_back();
      unicode::append_utf8(lower, words.back());
      words.emplace_back();
    } else {
      unicode::append_utf8(lower, words.back());
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

std::unique_ptr<Tokenizer> make_wordpiece_tokenizer(WordPieceSpec spec) {
  MILES_CHECK(spec.types.size() == spec.pieces.size());
  return std::make_unique<WordPieceTokenizer>(std::move(spec));
}

}  // namespace miles::tokenizer
