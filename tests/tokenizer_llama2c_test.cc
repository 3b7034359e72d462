// The llama2.c tokenizer against llama2.c's run.c: the reference ids and text of shared/README.md,
// a line-by-line transcription of run.c's encode on random inputs, byte-exact round trips, and
// malformed files. Tests that need ../shared skip without it; the synthetic-vocabulary tests always
// run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "miles/tokenizer.h"
#include "test_paths.h"

namespace miles {
namespace {

std::string tok512_path() { return test::shared_dir() + "/models/stories260K/tok512.bin"; }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A llama2.c tokenizer file image.
struct Vocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
};
void put_i32(std::string& out, int32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_f32(std::string& out, float v) { out.append(reinterpret_cast<const char*>(&v), 4); }
std::string serialize(const Vocab& v) {
  size_t max_len = 1;
  for (const auto& p : v.pieces) max_len = std::max(max_len, p.size());
  std::string out;
  put_i32(out, static_cast<int32_t>(max_len));
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    put_f32(out, v.scores[i]);
    put_i32(out, static_cast<int32_t>(v.pieces[i].size()));
    out += v.pieces[i];
  }
  return out;
}
Vocab parse_vocab(const std::string& bytes, int32_t n) {
  Vocab v;
  size_t off = 4;
  for (int32_t i = 0; i < n; ++i) {
    float s;
    int32_t len;
    std::memcpy(&s, bytes.data() + off, 4);
    std::memcpy(&len, bytes.data() + off + 4, 4);
    off += 8;
    v.scores.push_back(s);
    v.pieces.push_back(bytes.substr(off, len));
    off += len;
  }
  return v;
}

// <unk>, BOS, EOS, the 256 byte pieces, then `extra` pieces with their scores.
Vocab synthetic_vocab(const std::vector<std::pair<std::string, float>>& extra) {
  Vocab v;
  v.pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.pieces.push_back(buf);
    v.scores.push_back(0);
  }
  for (const auto& [piece, score] : extra) {
    v.pieces.push_back(piece);
    v.scores.push_back(score);
  }
  return v;
}

std::unique_ptr<Tokenizer> must_parse(const Vocab& v) {
  auto r =
      parse_llama2c_tokenizer(serialize(v), "synthetic.bin", static_cast<int32_t>(v.pieces.size()));
  EXPECT_TRUE(r.ok()) << r.message();
  return std::move(r).value();
}

// llama2.c run.c's encode(), transcribed statement by statement (quadratic rescans, strict `>`,
// initial best score -1e10, BOS inside the merges). An independent reference for the heap-based
// encoder.
std::vector<int32_t> run_c_encode(const Vocab& v, std::string_view text, bool bos) {
  std::map<std::string, int32_t> sorted_vocab;
  for (size_t i = 0; i < v.pieces.size(); ++i)
    sorted_vocab.emplace(v.pieces[i], static_cast<int32_t>(i));
  const auto str_lookup = [&](const std::string& s) {
    const auto it = sorted_vocab.find(s);
    return it == sorted_vocab.end() ? -1 : it->second;
  };
  std::vector<int32_t> tokens;
  if (bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(str_lookup(" "));
  std::string str_buffer;
  for (size_t c = 0; c < text.size(); ++c) {
    if ((static_cast<unsigned char>(text[c]) & 0xC0) != 0x80) str_buffer.clear();
    str_buffer.push_back(text[c]);
    const unsigned char next = c + 1 < text.size() ? static_cast<unsigned char>(text[c + 1]) : 0;
    if ((next & 0xC0) == 0x80 && str_buffer.size() < 4) continue;
    const int32_t id = str_lookup(str_buffer);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (const char b : str_buffer) tokens.push_back(static_cast<unsigned char>(b) + 3);
    }
    str_buffer.clear();
  }
  while (true) {
    float best_score = -1e10;
    int32_t best_id = -1, best_idx = -1;
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(tokens.size()); ++i) {
      const int32_t id = str_lookup(v.pieces[tokens[i]] + v.pieces[tokens[i + 1]]);
      if (id != -1 && v.scores[id] > best_score) {
        best_score = v.scores[id];
        best_id = id;
        best_idx = i;
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return tokens;
}

// Random text mixing vocabulary pieces, ASCII, multi-byte UTF-8 and invalid byte sequences.
std::string random_text(std::mt19937& rng, const Vocab& v, int parts) {
  // clang-format off
  static const std::vector<std::string> kFragments = {
      " ", "  ", "\n", "\t", "a", "e", ".", ",", "Lily", "Once", " upon", "<0x41>",
      "é", "ñ", "ü", "世", "界", "日本語", "🙂", "“",
      "\xff", "\xc3", "\xe2\x80", "\xf0\x9f", "\x80\x80", "\x80\x80\x80\x80\x80\x80"};
  // clang-format on
  std::string out;
  for (int i = 0; i < parts; ++i) {
    const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
    if (kind == 0) {
      out += v.pieces[std::uniform_int_distribution<size_t>(259, v.pieces.size() - 1)(rng)];
    } else if (kind == 1) {
      const auto& f =
          kFragments[std::uniform_int_distribution<size_t>(0, kFragments.size() - 1)(rng)];
      out += f;
    } else {
      out.push_back(static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng)));
    }
  }
  return out;
}

// ---- stories260K's tok512.bin ------------------------------------------------------------------

class Tok512 : public ::testing::Test {
 protected:
  void SetUp() override {
    MILES_REQUIRE_SHARED();
    auto r = load_llama2c_tokenizer(tok512_path(), 512);
    ASSERT_TRUE(r.ok()) << r.message();
    tok_ = std::move(r).value();
    vocab_ = parse_vocab(read_bytes(tok512_path()), 512);
  }
  std::unique_ptr<Tokenizer> tok_;
  Vocab vocab_;
};

TEST_F(Tok512, Basics) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->token_text(0), "<unk>");
  EXPECT_EQ(tok_->token_text(1), "\n<s>\n");
  EXPECT_EQ(tok_->token_text(13), "<0x0A>");
  EXPECT_EQ(tok_->token_text(403), " Once");
}

// shared/README.md: run.c's prompt ids for "Once upon a time".
TEST_F(Tok512, ReferencePromptIds) {
  EXPECT_EQ(tok_->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok_->encode("Once upon a time", false), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(tok_->encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok_->encode("", false), (std::vector<int32_t>{}));
}

// shared/README.md: run.c's greedy continuation ids, streamed after the prompt's last id as run.c
// prints them. The 20 ids end inside "outside"; the README's sentence continues past them.
TEST_F(Tok512, ReferenceContinuationText) {
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const std::vector<int32_t> cont = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317,
                                     426, 338, 401, 396, 267, 337, 410, 408, 419, 292};
  std::string streamed;
  int32_t prev = prompt.back();
  for (const int32_t id : cont) {
    streamed += tok_->decode_piece(prev, id);
    prev = id;
  }
  EXPECT_EQ(streamed, ", there was a little girl named Lily. She loved to play outsid");
  const std::string readme =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park.";
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), cont.begin(), cont.end());
  const std::string text = tok_->decode(all);
  EXPECT_EQ(text, "Once upon a time, there was a little girl named Lily. She loved to play outsid");
  EXPECT_EQ(readme.compare(0, text.size(), text), 0);
}

TEST_F(Tok512, DecodePiece) {
  EXPECT_EQ(tok_->decode_piece(1, 403), "Once");     // the dummy-prefix space goes after BOS
  EXPECT_EQ(tok_->decode_piece(378, 403), " Once");  // and only there
  EXPECT_EQ(tok_->decode_piece(-1, 403), " Once");
  EXPECT_EQ(tok_->decode_piece(403, 13), "\n");  // <0x0A>
  EXPECT_EQ(tok_->decode_piece(403, 3), std::string(1, '\0'));
  EXPECT_EQ(tok_->decode_piece(403, 258), "\xff");
  EXPECT_EQ(tok_->decode_piece(403, 1), "");  // BOS
  EXPECT_EQ(tok_->decode_piece(403, 2), "");  // EOS
  EXPECT_EQ(tok_->decode_piece(403, 0), "<unk>");
}

// "é" is a piece (485); 世, 界 and 🙂 are not, so their UTF-8 bytes fall back to ids byte + 3.
// The dummy prefix: with BOS, decode drops the leading space (decode(encode(x, true)) == x);
// without BOS nothing drops it (decode(encode(x, false)) == " " + x).
TEST_F(Tok512, Utf8ByteFallbackAndRoundTrip) {
  const std::string x = "héllo 世界 🙂";
  const std::vector<int32_t> ids = tok_->encode(x, true);
  EXPECT_EQ(run_c_encode(vocab_, x, true), ids);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 485), ids.end());
  // The only byte-fallback ids are those of 世, 界 and 🙂, in order.
  std::vector<int32_t> fallback;
  for (const unsigned char b : std::string("世界🙂")) fallback.push_back(b + 3);
  std::vector<int32_t> bytes_seen;
  for (const int32_t id : ids)
    if (id >= 3 && id <= 258) bytes_seen.push_back(id);
  EXPECT_EQ(bytes_seen, fallback);
  EXPECT_EQ(tok_->decode(ids), x);
  EXPECT_EQ(tok_->decode(tok_->encode(x, false)), " " + x);
}

// The heap-based encoder against the transcription of run.c, and byte-exact round trips, on random
// text including invalid UTF-8, NUL bytes and runs of continuation bytes.
TEST_F(Tok512, MatchesRunCOnRandomText) {
  const std::string nul("a\0b", 3);  // random bytes below also hit NUL now and then
  EXPECT_EQ(tok_->encode(nul, true), run_c_encode(vocab_, nul, true));
  EXPECT_EQ(tok_->decode(tok_->encode(nul, true)), nul);
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 400; ++trial) {
    const std::string x = random_text(rng, vocab_, 1 + trial % 40);
    const bool bos = trial % 2 == 0;
    const std::vector<int32_t> ids = tok_->encode(x, bos);
    ASSERT_EQ(ids, run_c_encode(vocab_, x, bos)) << "trial " << trial;
    ASSERT_EQ(tok_->decode(ids), bos ? x : " " + x) << "trial " << trial;
  }
}

TEST_F(Tok512, LongTextRoundTrips) {
  std::mt19937 rng(7);
  const std::string x = random_text(rng, vocab_, 50000);
  const std::vector<int32_t> ids = tok_->encode(x, true);
  EXPECT_LT(ids.size(), x.size());
  EXPECT_EQ(tok_->decode(ids), x);
}

TEST_F(Tok512, VocabSizeZeroReadsToTheEnd) {
  auto r = load_llama2c_tokenizer(tok512_path(), 0);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r.value()->vocab_size(), 512);
}

TEST_F(Tok512, WrongVocabSizeIsRejected) {
  auto fewer = load_llama2c_tokenizer(tok512_path(), 511);
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.message().find("tok512.bin"), std::string::npos) << fewer.message();
  EXPECT_NE(fewer.message().find("unexpected bytes"), std::string::npos) << fewer.message();
  auto more = load_llama2c_tokenizer(tok512_path(), 513);
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.message().find("entry 512 of 513"), std::string::npos) << more.message();
}

// Every strict prefix of the file is truncated: each is rejected, none reads past the end.
TEST_F(Tok512, EveryTruncationIsRejected) {
  const std::string bytes = read_bytes(tok512_path());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);  // own allocation: ASan sees an overread
    auto r = parse_llama2c_tokenizer(prefix, "cut.bin", 512);
    ASSERT_FALSE(r.ok()) << n;
    ASSERT_NE(r.message().find("cut.bin"), std::string::npos) << r.message();
    ASSERT_NE(r.message().find("truncated"), std::string::npos) << r.message();
  }
}

TEST_F(Tok512, LoadTokenizerRecognisesFormats) {
  auto ok = load_tokenizer(tok512_path(), 512);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok.value()->encode("Once upon a time", true),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
  auto unknown_size = load_tokenizer(tok512_path(), 0);
  ASSERT_TRUE(unknown_size.ok()) << unknown_size.message();

  const std::string qwen_dir = test::shared_dir() + "/tokenizers/qwen3";
  for (const std::string& path :
       {qwen_dir, qwen_dir + "/tokenizer.json",
        test::shared_dir() + "/tokenizers/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"}) {
    if (!std::filesystem::exists(path)) continue;
    auto r = load_tokenizer(path, 0);  // HF directory, tokenizer.json and GGUF are recognised
    ASSERT_TRUE(r.ok()) << path << ": " << r.message();
  }
  auto missing = load_tokenizer(test::shared_dir() + "/no/such/tokenizer.bin", 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no/such/tokenizer.bin"), std::string::npos);
}

// ---- synthetic vocabularies (no shared/ needed) ------------------------------------------------

TEST(Llama2cTokenizer, TiesMergeTheLeftmostPair) {
  const Vocab v = synthetic_vocab({{" ", -1}, {"a", -2}, {"aa", -3}});
  const auto tok = must_parse(v);
  // [" ", a, a, a]: the pairs (a, a) at positions 1 and 2 score the same; run.c merges position 1.
  EXPECT_EQ(tok->encode("aaa", false), (std::vector<int32_t>{259, 261, 260}));
  EXPECT_EQ(tok->encode("aaa", false), run_c_encode(v, "aaa", false));
}

TEST(Llama2cTokenizer, HigherScoreMergesFirst) {
  const Vocab v =
      synthetic_vocab({{" ", -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}});
  const auto tok = must_parse(v);
  EXPECT_EQ(tok->encode("abc", true), (std::vector<int32_t>{1, 259, 260, 264}));  // ␣ a bc
  EXPECT_EQ(tok->encode("abc", true), run_c_encode(v, "abc", true));
}

TEST(Llama2cTokenizer, ScoresAtOrBelowMinus1e10NeverMerge) {
  const Vocab v =
      synthetic_vocab({{" ", -1}, {"a", -1}, {"b", -1}, {"ab", -1e10f}, {" a", -2e10f}});
  const auto tok = must_parse(v);
  EXPECT_EQ(tok->encode("ab", false), (std::vector<int32_t>{259, 260, 261}));
  EXPECT_EQ(tok->encode("ab", false), run_c_encode(v, "ab", false));
}

TEST(Llama2cTokenizer, MultiByteCodepointPieceAndFallback) {
  const Vocab v = synthetic_vocab({{" ", -1}, {"é", -1}, {" é", -3}});
  const auto tok = must_parse(v);
  // "é" is a piece and merges with the dummy prefix; "ü" (c3 bc) falls back to two byte ids.
  EXPECT_EQ(tok->encode("éü", false), (std::vector<int32_t>{261, 0xC3 + 3, 0xBC + 3}));
  EXPECT_EQ(tok->decode(tok->encode("éü", true)), "éü");
}

TEST(Llama2cTokenizer, MalformedFilesAreRejected) {
  const Vocab v = synthetic_vocab({{" ", -1}, {"ab", -1}});
  const int32_t n = static_cast<int32_t>(v.pieces.size());
  const std::string good = serialize(v);
  ASSERT_TRUE(parse_llama2c_tokenizer(good, "t.bin", n).ok());

  const auto expect_error = [&](const std::string& bytes, int32_t vocab, const std::string& what) {
    auto r = parse_llama2c_tokenizer(bytes, "bad.bin", vocab);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.message().find("bad.bin"), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(what), std::string::npos) << r.message();
  };
  // The offset of entry i's score.
  const auto entry_offset = [&](int32_t i) {
    size_t off = 4;
    for (int32_t j = 0; j < i; ++j) off += 8 + v.pieces[j].size();
    return off;
  };
  const auto with_i32 = [&](size_t off, int32_t value) {
    std::string b = good;
    std::memcpy(b.data() + off, &value, 4);
    return b;
  };
  expect_error(with_i32(entry_offset(100) + 4, -1), n,
               "entry 100 of 261: piece length -1 is negative");
  expect_error(with_i32(entry_offset(7) + 4, std::numeric_limits<int32_t>::max()), n,
               "entry 7 of 261");
  expect_error(with_i32(entry_offset(260) + 4, 6), n,
               "entry 260 of 261");  // longer than what is left
  expect_error(with_i32(entry_offset(260) + 4, 6), 0, "entry 260");
  expect_error(with_i32(0, 0), n, "max_token_length 0");
  expect_error(with_i32(0, -5), n, "max_token_length -5");
  expect_error(with_i32(0, 1 << 30), n, "max_token_length 1073741824");
  expect_error(with_i32(0, 2), n,
               "entry 0 of 261: piece length 5 exceeds the file's max_token_length 2");
  std::string nan_score = good;
  const float nan = std::nanf("");
  std::memcpy(nan_score.data() + entry_offset(42), &nan, 4);
  expect_error(nan_score, n, "entry 42 of 261: score is NaN");
  expect_error(good + "x", n, "1 unexpected bytes");
  expect_error(good, n + 1, "truncated at entry 261 of 262");
  expect_error(good, -3, "vocab_size -3");
  expect_error("", n, "truncated");
  expect_error(serialize(Vocab{{"<unk>", "<s>"}, {0, 0}}), 0, "needs at least <unk>, BOS and EOS");
}

TEST(Llama2cTokenizer, ReadsFromDisk) {
  const Vocab v = synthetic_vocab({{" ", -1}, {"h", -1}, {"i", -1}, {"hi", -1}, {" hi", -2}});
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("miles_tok_" + std::to_string(::getpid()) + ".bin"))
                               .string();
  {
    std::ofstream f(path, std::ios::binary);
    f << serialize(v);
  }
  auto r = load_tokenizer(path, 0);
  std::filesystem::remove(path);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r.value()->encode("hi", true), (std::vector<int32_t>{1, 263}));
  auto missing = load_llama2c_tokenizer(path, 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(path), std::string::npos);
}

}  // namespace
}  // namespace miles
