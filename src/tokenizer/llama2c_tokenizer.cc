// The llama2.c tokenizer: reading tokenizer .bin files and run.c's encode / decode, exactly.
//
// Why: stories260K and every llama2.c model come with this format, and the project's end-to-end
// reference (shared/README.md) is run.c's output; our ids must be run.c's ids for any input bytes.
//
// run.c's `encode`, reproduced here:
//  1. BOS when asked; then, when the text is non-empty, the id of the piece " " (SentencePiece's
//  dummy
//     prefix);
//  2. the text cut into UTF-8 codepoints (a lead byte starts a new one; at most 4 bytes each; stray
//     continuation bytes are grouped the same way run.c groups them); a codepoint that is a piece
//     gives its id, otherwise each of its bytes b gives the byte-fallback id b + 3;
//  3. repeatedly: among adjacent pairs whose concatenation is a piece, merge the one whose piece
//  has the
//     highest score (the leftmost on ties, run.c's strict `>`; only scores above -1e10, run.c's
//     initial best), until no pair merges. BOS takes part in the merges as in run.c.
// run.c rescans all pairs after each merge (quadratic); we keep the candidate pairs in a heap
// ordered by (score desc, left position asc) and drop stale ones when popped, which picks the same
// pair each time because merged symbols keep the slot of their left part, so slot order is position
// order.
//
// Differences from run.c, all outside what a well-formed file and run.c's own behaviour define:
// when two entries hold the same piece the lowest id wins (run.c's bsearch picks either); when
// ids 3..258 are not the pieces <0x00>..<0xFF> byte fallback gives <unk> (0) instead of ids that
// mean something else; when " " is not a piece the dummy prefix falls back like any other byte
// (run.c would emit id -1); decoding turns only pieces of exactly the form <0xNN> into bytes
// (run.c's sscanf also accepts "<0xA" and
// "<0x41junk"); BOS and EOS decode to nothing.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <queue>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "miles/check.h"
#include "miles/tokenizer.h"

namespace miles {
namespace {

constexpr int32_t kUnkId = 0;
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int32_t kFirstByteId = 3;                // ids 3..258 are <0x00>..<0xFF>
constexpr float kMinMergeScore = -1e10f;           // run.c's initial best_score; merges need more
constexpr int32_t kMaxTokenLengthLimit = 1 << 16;  // larger max_token_length means a corrupt file

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
// -1, or the byte NN of a piece that reads exactly "<0xNN>" (hex digits in either case).
int byte_of_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                   int32_t max_token_length)
      : pieces_(std::move(pieces)),
        scores_(std::move(scores)),
        max_token_length_(max_token_length) {
    const int32_t n = static_cast<int32_t>(pieces_.size());
    for (int32_t id = 0; id < n; ++id) lookup_.emplace(pieces_[id], id);  // keeps the lowest id
    has_byte_fallback_ = n >= kFirstByteId + 256;
    for (int b = 0; b < 256 && has_byte_fallback_; ++b)
      has_byte_fallback_ = byte_of_piece(pieces_[kFirstByteId + b]) == b;
    decoded_.resize(n);
    for (int32_t id = 0; id < n; ++id) {
      const int b = byte_of_piece(pieces_[id]);
      decoded_[id] = b >= 0 ? std::string(1, static_cast<char>(b)) : pieces_[id];
    }
    decoded_[kBosId].clear();
    decoded_[kEosId].clear();
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() + 2);
    if (add_special) ids.push_back(kBosId);
    if (!text.empty()) append_piece_or_bytes(" ", ids);
    append_codepoints(text, ids);
    merge_pairs(ids);
    return ids;
  }

  std::string decode_piece(int32_t prev_id, int32_t id) const override {
    check_id(id);
    const std::string& s = decoded_[id];
    // SentencePiece's decoder drops the dummy-prefix space of the first piece (llama2.c PR #89).
    if (prev_id == kBosId && !s.empty() && s[0] == ' ') return s.substr(1);
    return s;
  }

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return kBosId; }
  int32_t eos_id() const override { return kEosId; }
  std::string token_text(int32_t id) const override {
    check_id(id);
    return pieces_[id];
  }

 private:
  void check_id(int32_t id) const {
    MILES_CHECK(id >= 0 && id < vocab_size(), "token id outside the llama2.c vocabulary");
  }

  int32_t find(std::string_view piece) const {
    const auto it = lookup_.find(piece);
    return it == lookup_.end() ? -1 : it->second;
  }

  // Step 1/2: the id of `piece`, or one byte-fallback id per byte.
  void append_piece_or_bytes(std::string_view piece, std::vector<int32_t>& ids) const {
    const int32_t id = find(piece);
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
    for (const char c : piece)
      ids.push_back(has_byte_fallback_ ? kFirstByteId + static_cast<unsigned char>(c) : kUnkId);
  }

  // Step 2, run.c's loop over bytes: a non-continuation byte restarts the buffer; the buffer is
  // looked up when the next byte is not a continuation byte or the buffer holds 4 bytes.
  void append_codepoints(std::string_view text, std::vector<int32_t>& ids) const {
    size_t begin = 0, len = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) len = 0;
      if (len == 0) begin = i;
      ++len;
      const bool next_continues =
          i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
      if (next_continues && len < 4) continue;
      append_piece_or_bytes(text.substr(begin, len), ids);
      len = 0;
    }
  }

  // Step 3. `ids` in, merged ids out.
  void merge_pairs(std::vector<int32_t>& ids) const {
    const int32_t n = static_cast<int32_t>(ids.size());
    if (n < 2) return;
    struct Symbol {
      int32_t id;    // -1 once merged into its left neighbour
      int32_t next;  // slot of the right neighbour, n at the end
      int32_t prev;  // slot of the left neighbour, -1 at the start
    };
    struct Candidate {
      float score;
      int32_t left, right;  // slots
      int32_t left_id, right_id, merged_id;
    };
    // Highest score first; on equal scores the leftmost pair first.
    const auto after = [](const Candidate& a, const Candidate& b) {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    };
    std::vector<Symbol> sym(n);
    for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i + 1, i - 1};
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(after)> heap(after);
    std::string buf;
    const auto push_pair = [&](int32_t left, int32_t right) {
      if (left < 0 || right >= n) return;
      const std::string& a = pieces_[sym[left].id];
      const std::string& b = pieces_[sym[right].id];
      if (a.size() + b.size() > static_cast<size_t>(max_token_length_)) return;
      buf.assign(a).append(b);
      const int32_t merged = find(buf);
      if (merged < 0 || !(scores_[merged] > kMinMergeScore)) return;
      heap.push({scores_[merged], left, right, sym[left].id, sym[right].id, merged});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      Symbol& l = sym[c.left];
      Symbol& r = sym[c.right];
      if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;  // stale
      l.id = c.merged_id;
      r.id = -1;
      l.next = r.next;
      if (r.next < n) sym[r.next].prev = c.left;
      push_pair(l.prev, c.left);
      push_pair(c.left, l.next);
    }
    ids.clear();
    for (int32_t i = 0; i < n; i = sym[i].next) ids.push_back(sym[i].id);
  }

  std::vector<std::string> pieces_;  // (vocab_size) raw bytes of each entry
  std::vector<float> scores_;        // (vocab_size) merge priority, higher merges first
  int32_t max_token_length_ = 0;     // bytes; no piece is longer
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> lookup_;  // piece -> id
  bool has_byte_fallback_ = false;    // ids 3..258 are <0x00>..<0xFF>
  std::vector<std::string> decoded_;  // (vocab_size) bytes printed for each id
};

// Bounds-checked little-endian reads over the file's bytes.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }
  template <typename T>
  bool read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  std::string take(size_t n) {  // note: call only if left() >= n
    MILES_CHECK(left() >= n);
    std::string s(bytes_.substr(pos_, n));
    pos_ += n;
    return s;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_llama2c_tokenizer(std::string_view bytes,
                                                           const std::string& source,
                                                           int32_t vocab_size) {
  const auto error = [&](const std::string& what) {
    return Status::Error(source + ": llama2.c tokenizer: " + what);
  };
  if (vocab_size < 0)
    return error("vocab_size " + std::to_string(vocab_size) + " is negative (0 reads to the end)");
  Reader in(bytes);
  int32_t max_token_length = 0;
  if (!in.read(&max_token_length))
    return error("truncated: " + std::to_string(bytes.size()) +
                 " bytes, need 4 for max_token_length");
  if (max_token_length < 1 || max_token_length > kMaxTokenLengthLimit)
    return error("max_token_length " + std::to_string(max_token_length) + " is outside [1, " +
                 std::to_string(kMaxTokenLengthLimit) + "]");

  std::vector<std::string> pieces;
  std::vector<float> scores;
  const std::string of_n = vocab_size > 0 ? " of " + std::to_string(vocab_size) : "";
  for (int32_t i = 0; vocab_size > 0 ? i < vocab_size : in.left() > 0; ++i) {
    const std::string entry = "entry " + std::to_string(i) + of_n;
    const size_t at = in.pos();
    float score = 0;
    int32_t len = 0;
    if (!in.read(&score) || !in.read(&len))
      return error("truncated at " + entry + " (offset " + std::to_string(at) +
                   "): score and length need 8 bytes, " + std::to_string(bytes.size() - at) +
                   " left");
    if (std::isnan(score)) return error(entry + ": score is NaN");
    if (len < 0) return error(entry + ": piece length " + std::to_string(len) + " is negative");
    if (len > max_token_length)
      return error(entry + ": piece length " + std::to_string(len) +
                   " exceeds the file's max_token_length " + std::to_string(max_token_length));
    if (in.left() < static_cast<size_t>(len))
      return error("truncated at " + entry + " (offset " + std::to_string(in.pos()) +
                   "): piece needs " + std::to_string(len) + " bytes, " +
                   std::to_string(in.left()) + " left");
    pieces.push_back(in.take(static_cast<size_t>(len)));
    scores.push_back(score);
  }
  if (in.left() > 0)
    return error(std::to_string(in.left()) + " unexpected bytes after the " +
                 std::to_string(vocab_size) + " entries (does the model's vocab_size match?)");
  if (pieces.size() < 3)
    return error("holds " + std::to_string(pieces.size()) +
                 " entries; needs at least <unk>, BOS and EOS");
  return std::unique_ptr<Tokenizer>(
      new Llama2cTokenizer(std::move(pieces), std::move(scores), max_token_length));
}

Result<std::unique_ptr<Tokenizer>> load_llama2c_tokenizer(const std::string& path,
                                                          int32_t vocab_size) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error(path + ": cannot open the llama2.c tokenizer file");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return Status::Error(path + ": read error");
  return parse_llama2c_tokenizer(bytes, path, vocab_size);
}

}  // namespace miles
