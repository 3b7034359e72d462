// SpmTokenizer: llama.cpp's llm_tokenizer_spm over a GGUF vocabulary (see spm_tokenizer.h).
//
// The merge queue is llama.cpp's: bigrams ordered by (score desc, left position asc); a popped
// bigram is stale when either symbol changed size since it was queued. Added tokens (control,
// user-defined, unknown types) are cut out first, longest token first, as llama.cpp's
// tokenizer_st_partition does. Decoding turns U+2581 back into spaces, <0xNN> pieces into bytes,
// and drops the space that encoding put in front of the first piece of a stretch.
#include "tokenizer/spm_tokenizer.h"

#include <cstdio>
#include <queue>
#include <unordered_map>

#include "miles/check.h"
#include "tokenizer/added_tokens.h"

namespace miles::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

struct Symbol {
  int32_t prev, next;
  size_t begin, len;  // bytes of the escaped text
};

struct Bigram {
  int32_t left, right;
  float score;
  size_t size;
};
struct BigramOrder {  // priority_queue puts the "largest" on top
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

// llama.cpp unicode_len_utf8: the length a lead byte announces (1 for continuation bytes).
size_t utf8_len(uint8_t b) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[b >> 4];
}

int byte_of_piece(std::string_view p) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(SpmSpec s) : spec_(std::move(s)) {
    const auto n = static_cast<int32_t>(spec_.pieces.size());
    std::vector<AddedToken> added;
    decoded_.resize(n);
    for (int32_t id = 0; id < n; ++id) {
      lookup_[spec_.pieces[id]] = id;  // later ids win, as llama.cpp's token_to_id
      if (is_added_type(spec_.types[id]))
        added.push_back({spec_.pieces[id], id, spec_.types[id] != kTokenUserDefined});
      decoded_[id] = decode_text(id);
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = lookup_.find(name);
      byte_ids_[b] = it != lookup_.end() ? it->second : spec_.unk_id;
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
    bool prev_added = true;
    for (const Segment& s : segs) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        prev_added = true;
        continue;
      }
      std::string escaped;
      if (spec_.add_space_prefix && prev_added) escaped = kSpaceMark;
      for (const char c : text.substr(s.begin, s.end - s.begin)) {
        if (c == ' ') {
          escaped += kSpaceMark;
        } else {
          escaped.push_back(c);
        }
      }
      encode_escaped(escaped, ids);
      prev_added = false;
    }
    if (options.add_special && spec_.add_eos && spec_.eos_id >= 0) ids.push_back(spec_.eos_id);
    return ids;
  }

  std::string decode_piece(int32_t prev_id, int32_t id) const override {
    check_id(id);
    const std::string& s = decoded_[id];
    const bool after_start = prev_id < 0 || is_added(prev_id);
    if (spec_.add_space_prefix && after_start && !is_added(id) && !s.empty() && s[0] == ' ')
      return s.substr(1);
    return s;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(spec_.pieces.size()); }
  bool is_special(int32_t id) const override {
    const int32_t t = spec_.types[static_cast<size_t>(id)];
    return t == kTokenControl || t == kTokenUnknown || id == spec_.bos_id || id == spec_.eos_id;
  }
  int32_t bos_id() const override { return spec_.bos_id; }
  int32_t eos_id() const override { return spec_.eos_id; }
  std::string token_text(int32_t id) const override {
    check_id(id);
    return spec_.pieces[id];
  }

 private:
  void check_id(int32_t id) const {
    MILES_CHECK(id >= 0 && id < vocab_size(), "token id outside the vocabulary");
  }
  bool is_added(int32_t id) const {
    return id >= 0 && id < vocab_size() && is_added_type(spec_.types[id]);
  }
  std::string decode_text(int32_t id) const {
    const std::string& p = spec_.pieces[id];
    if (spec_.types[id] == kTokenByte) {
      const int b = byte_of_piece(p);
      if (b >= 0) return std::string(1, static_cast<char>(b));
    }
    if (is_added(id)) return p;
    std::string out;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
        out.push_back(' ');
        i += kSpaceMark.size();
      } else {
        out.push_back(p[i++]);
      }
    }
    return out;
  }
  int32_t find(std::string_view piece) const {
    auto it = lookup_.find(std::string(piece));
    return it == lookup_.end() ? -1 : it->second;
  }

  void encode_escaped(std::string_view text, std::vector<int32_t>& ids) const {
    std::vector<Symbol> sym;
    for (size_t i = 0; i < text.size();) {
      const size_t len = std::min(utf8_len(static_cast<uint8_t>(text[i])), text.size() - i);
      const auto k = static_cast<int32_t>(sym.size());
      sym.push_back({k - 1, -1, i, len});
      if (k > 0) sym[k - 1].next = k;
      i += len;
    }
    std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
    auto try_add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const std::string_view pair = text.substr(sym[left].begin, sym[left].len + sym[right].len);
      const int32_t id = find(pair);
      if (id < 0) return;
      queue.push({left, right, spec_.scores[id], pair.size()});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      Symbol& r = sym[b.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
      const std::string_view piece = text.substr(sym[i].begin, sym[i].len);
      const int32_t id = find(piece);
      if (id >= 0) {
        ids.push_back(id);
        continue;
      }
      for (const char c : piece) {
        const int32_t bid = byte_ids_[static_cast<uint8_t>(c)];
        if (bid >= 0) ids.push_back(bid);
      }
    }
  }

  SpmSpec spec_;
  std::unordered_map<std::string, int32_t> lookup_;
  std::vector<std::string> decoded_;
  int32_t byte_ids_[256];
  AddedTokenMatcher added_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmSpec spec) {
  MILES_CHECK(spec.scores.size() == spec.pieces.size() && spec.types.size() == spec.pieces.size());
  return std::make_unique<SpmTokenizer>(std::move(spec));
}

}  // namespace miles::tokenizer
