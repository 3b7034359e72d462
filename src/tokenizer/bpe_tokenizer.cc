// BpeTokenizer: HF's encode pipeline over a BpeTokenizerSpec (see bpe_tokenizer.h).
//
// The order is HF's TokenizerImpl::encode_single_sequence: (1) cut out the added tokens that
// match the raw text, (2) normalize each remaining stretch on its own, (3) cut out the added
// tokens that match normalized text, (4) pre-tokenize, (5) BPE each word, then (6) the
// post-processor's special tokens when asked. Decoding concatenates each id's bytes, computed once
// at load.
#include "tokenizer/bpe_tokenizer.h"

#include "miles/check.h"
#include "tokenizer/unicode.h"

namespace miles::tokenizer {
namespace {

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeTokenizerSpec spec)
      : token_text_(std::move(spec.token_text)),
        token_bytes_(std::move(spec.token_bytes)),
        first_token_bytes_(std::move(spec.first_token_bytes)),
        model_(std::move(spec.model_vocab), spec.merges, spec.options),
        normalizer_(std::move(spec.normalizer)),
        pre_(std::move(spec.pre_tokenizer)),
        prefix_(std::move(spec.prefix)),
        suffix_(std::move(spec.suffix)),
        bos_(spec.bos_id),
        eos_(spec.eos_id) {
    MILES_CHECK(token_text_.size() == token_bytes_.size());
    MILES_CHECK(first_token_bytes_.empty() || first_token_bytes_.size() == token_bytes_.size());
    std::vector<AddedToken> raw, normalized;
    special_.assign(token_text_.size(), false);
    for (AddedToken& t : spec.added_tokens) {
      if (t.special && t.id >= 0 && t.id < vocab_size()) special_[t.id] = true;
      (t.normalized ? normalized : raw).push_back(t);
    }
    for (int32_t id : {bos_, eos_})
      if (id >= 0 && id < vocab_size()) special_[id] = true;
    raw_added_ = AddedTokenMatcher(std::move(raw), spec.added_strategy);
    normalized_added_ = AddedTokenMatcher(std::move(normalized), spec.added_strategy);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    return encode_with(text, EncodeOptions{add_special, true});
  }

  std::vector<int32_t> encode_with(std::string_view text,
                                   const EncodeOptions& options) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + prefix_.size() + suffix_.size() + 1);
    if (options.add_special) ids.insert(ids.end(), prefix_.begin(), prefix_.end());
    std::vector<Segment> raw;
    raw_added_.split(text, options.parse_special, raw);
    for (const Segment& s : raw) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encode_plain(text.substr(s.begin, s.end - s.begin), s.begin == 0, options.parse_special,
                     ids);
      }
    }
    if (options.add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i]);
      out += bytes_of(ids[i], i == 0);
    }
    return out;
  }

  std::string decode_piece(int32_t prev_id, int32_t id) const override {
    check_id(id);
    return bytes_of(id, prev_id < 0);
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(token_text_.size()); }
  bool is_special(int32_t id) const override {
    check_id(id);
    return special_[id];
  }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  std::string token_text(int32_t id) const override {
    check_id(id);
    return token_text_[id];
  }

 private:
  void check_id(int32_t id) const {
    MILES_CHECK(id >= 0 && id < vocab_size(), "token id outside the vocabulary");
  }
  const std::string& bytes_of(int32_t id, bool first) const {
    return first && !first_token_bytes_.empty() ? first_token_bytes_[id] : token_bytes_[id];
  }

  // Steps (2)-(5) for a stretch without raw-matching added tokens; `at_start`: it begins the text.
  void encode_plain(std::string_view text, bool at_start, bool parse_special,
                    std::vector<int32_t>& ids) const {
    std::string normalized;
    if (!normalizer_.empty()) text = normalizer_.run(text, normalized);
    auto word = [&](std::string_view w) { model_.encode_word(w, ids); };
    if (normalized_added_.empty()) {
      pre_.run(text, word, at_start);
      return;
    }
    std::vector<Segment> segs;
    normalized_added_.split(text, parse_special, segs);
    for (const Segment& s : segs) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        pre_.run(text.substr(s.begin, s.end - s.begin), word, at_start && s.begin == 0);
      }
    }
  }

  std::vector<std::string> token_text_;
  std::vector<std::string> token_bytes_;
  std::vector<std::string> first_token_bytes_;
  std::vector<bool> special_;  // [vocab] added tokens marked special, BOS, EOS
  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  AddedTokenMatcher raw_added_, normalized_added_;
  std::vector<int32_t> prefix_, suffix_;
  int32_t bos_, eos_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerSpec spec) {
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace miles::tokenizer
