// GGUF reader: metadata of every value type, dequantisation bitwise equal to the `gguf` Python
// package (fixtures from scripts/make_gguf_fixtures.py), and every kind of broken file an error
// that names the file and the key or tensor, never a crash (run this binary under ASan too).
#include "miles/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "checkpoint/gguf_dequant.h"
#include "gguf_builder.h"
#include "miles/checkpoint.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::GgufBuilder;

std::string fixture(const std::string& name) { return test::data_dir() + "/gguf/" + name; }

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

Result<GgufFile> parse(const std::vector<uint8_t>& b, const std::string& name = "t.gguf") {
  return GgufFile::parse(b.data(), b.size(), name, nullptr);
}

// The error of parsing `b`; fails the test when it parses.
std::string parse_error(const std::vector<uint8_t>& b) {
  auto r = parse(b);
  EXPECT_FALSE(r.ok()) << "expected an error";
  return r.ok() ? "" : r.message();
}

std::vector<uint8_t> u64_bytes(uint64_t v) {
  std::vector<uint8_t> b;
  GgufBuilder::put_u64(b, v);
  return b;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- the fixture written by the gguf package ----------------------------------------------------

TEST(Gguf, MetadataOfEveryValueType) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(*f->get_string("general.architecture"), "test");
  EXPECT_EQ(*f->get_int("test.u8"), 200);
  EXPECT_EQ(*f->get_int("test.i8"), -100);
  EXPECT_EQ(*f->get_int("test.u16"), 60000);
  EXPECT_EQ(*f->get_int("test.i16"), -30000);
  EXPECT_EQ(*f->get_int("test.u32"), 4000000000);
  EXPECT_EQ(*f->get_int("test.i32"), -2000000000);
  EXPECT_EQ(*f->get_int("test.u64"), (int64_t{1} << 62) + 1);
  EXPECT_EQ(*f->get_int("test.i64"), -(int64_t{1} << 62) - 1);
  EXPECT_EQ(*f->get_float("test.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(*f->get_float("test.f64"), 0.1);
  EXPECT_EQ(*f->get_float("test.u8"), 200.0);  // integers read as floats too
  EXPECT_TRUE(*f->get_bool("test.bool"));
  EXPECT_EQ(*f->get_string("test.string"), "h\xc3\xa9llo \xe2\x9c\x93");
  EXPECT_EQ(*f->get_ints("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->get_strings("test.strings"), (std::vector<std::string>{"a", "", "\xc3\xbc"}));
  EXPECT_EQ(*f->get_floats("test.floats"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(*f->get_ints("test.bools"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f->find("test.bools")->elem, GgufType::kBool);
}

// gguf_metadata_image (what miles convert writes as tokenizer.gguf): every key of every value
// type read back with its type and value; the image has no tensors.
TEST(Gguf, MetadataImageReadsBackEveryKey) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto image = std::make_shared<std::string>(gguf_metadata_image(f->metadata()));
  auto back = GgufFile::parse(reinterpret_cast<const uint8_t*>(image->data()), image->size(),
                              "image", image);
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_TRUE(back->tensors().empty());
  ASSERT_EQ(back->metadata().size(), f->metadata().size());
  for (const auto& [key, v] : f->metadata()) {
    const GgufValue* w = back->find(key);
    ASSERT_NE(w, nullptr) << key;
    EXPECT_EQ(w->type, v.type) << key;
    EXPECT_EQ(w->elem, v.elem) << key;
    EXPECT_EQ(w->i, v.i) << key;
    EXPECT_EQ(w->f, v.f) << key;
    EXPECT_EQ(w->s, v.s) << key;
    EXPECT_EQ(w->ints, v.ints) << key;
    EXPECT_EQ(w->floats, v.floats) << key;
    EXPECT_EQ(w->strings, v.strings) << key;
  }
}

TEST(Gguf, GetterErrorsNameFileAndKey) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto missing = f->get_int("no.such.key");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("types.gguf"), std::string::npos) << missing.message();
  EXPECT_NE(missing.message().find("'no.such.key' is missing"), std::string::npos);
  auto wrong = f->get_int("test.string");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("'test.string' is string, expected an integer"), std::string::npos)
      << wrong.message();
  EXPECT_FALSE(f->get_strings("test.ints").ok());
  EXPECT_FALSE(f->get_bool("test.u8").ok());
  EXPECT_FALSE(f->get_int("test.bool").ok());
  EXPECT_FALSE(f->get_string("test.strings").ok());
}

// Bitwise: every type's decoder evaluates ggml's float operations in ggml's order, so there is no
// rounding slack to allow (NaNs compare by their bits; the fixture's NaNs are all quiet).
TEST(Gguf, DequantisationMatchesTheGgufPackageBitwise) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  auto expected = read_safetensors(fixture("types_expected.safetensors"));
  ASSERT_TRUE(expected.ok()) << expected.message();
  ASSERT_EQ(f->tensors().size(), expected->size());
  const std::map<std::string, std::string> types = {
      {"f32", "F32"},   {"f16", "F16"},       {"bf16", "BF16"},     {"q8_0", "Q8_0"},
      {"q4_0", "Q4_0"}, {"q4_1", "Q4_1"},     {"q4_k", "Q4_K"},     {"q6_k", "Q6_K"},
      {"q5_0", "Q5_0"}, {"q5_1", "Q5_1"},     {"q2_k", "Q2_K"},     {"q3_k", "Q3_K"},
      {"q5_k", "Q5_K"}, {"iq4_nl", "IQ4_NL"}, {"iq4_xs", "IQ4_XS"}, {"f32_3d", "F32"},
      {"f32_4d", "F32"}};
  for (const GgufTensorInfo& t : f->tensors()) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(types.count(t.name));
    EXPECT_EQ(gguf::ggml_type_name(t.type), types.at(t.name));
    auto got = f->dequantize(t);
    ASSERT_TRUE(got.ok()) << got.message();
    const Tensor* want = expected->find(t.name);
    ASSERT_NE(want, nullptr);
    ASSERT_EQ(got->shape(), want->shape());
    const float* g = got->data<float>();
    const float* w = want->data<float>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < want->numel(); ++i) mismatches += bits(g[i]) != bits(w[i]);
    EXPECT_EQ(mismatches, 0) << "of " << want->numel();
  }
}

TEST(Gguf, ShapesAreReversedGgmlNe) {
  auto f = GgufFile::open(fixture("types.gguf"));
  ASSERT_TRUE(f.ok()) << f.message();
  const GgufTensorInfo* t3 = f->find_tensor("f32_3d");
  ASSERT_NE(t3, nullptr);
  EXPECT_EQ(t3->ne, (std::vector<int64_t>{8, 3, 2}));
  EXPECT_EQ(f->dequantize(*t3)->shape(), (std::vector<int64_t>{2, 3, 8}));
  const GgufTensorInfo* q = f->find_tensor("q4_k");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{512, 3}));
  EXPECT_EQ(q->nbytes, 6u * 144u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
}

// Fuzzer find: a zero dimension first in ggml order and two huge ones after it. The element count
// is 0 (the reader multiplies in file order); the reversed shape must not overflow on the way.
TEST(Gguf, EmptyTensorWithHugeOtherDimsDequantisesToNothing) {
  const auto b = GgufBuilder().tensor("e", {0, 8029744612286621044ull, 2}, 0, {}).build();
  auto f = GgufFile::parse(b.data(), b.size(), "zero.gguf", nullptr);
  ASSERT_TRUE(f.ok()) << f.message();
  auto t = f->dequantize(*f->find_tensor("e"));
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->numel(), 0);
}

// ---- well-formed files from the builder ---------------------------------------------------------

TEST(Gguf, Version2ParsesLikeVersion3) {
  const auto b = GgufBuilder(2).kv_u32("a", 7).tensor_f32("w", {2}, {1.5f, -2.f}).build();
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->dequantize(f->tensors()[0])->to_f32(), (std::vector<float>{1.5f, -2.f}));
}

TEST(Gguf, CustomAlignmentPlacesTheData) {
  const auto b = GgufBuilder()
                     .alignment(64)
                     .tensor_f32("a", {3}, {1, 2, 3})
                     .tensor_f32("b", {2}, {4, 5})
                     .build();
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->tensors()[1].offset, 64u);
  EXPECT_EQ((f->tensors()[0].data - b.data()) % 64, 0);
  EXPECT_EQ(f->dequantize(f->tensors()[1])->to_f32(), (std::vector<float>{4, 5}));
}

TEST(Gguf, FileWithoutTensorsNeedsNoPadding) {
  const auto b = GgufBuilder().kv_str("general.architecture", "x").build();
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_TRUE(f->tensors().empty());
}

TEST(Gguf, KnownTypeWithoutDecoderParsesButDoesNotDequantise) {
  // IQ2_XXS: an i-quant with a code-book grid, which the reader does not decode.
  const auto b = GgufBuilder().tensor("w", {256}, 16, std::vector<uint8_t>(66)).build();
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.message();
  auto t = f->dequantize(f->tensors()[0]);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("tensor 'w' has ggml type IQ2_XXS"), std::string::npos) << t.message();
}

// ---- broken files: each an error naming the file and what is wrong ------------------------------

TEST(GgufBad, HeaderProblems) {
  EXPECT_NE(parse_error({}).find("t.gguf: magic"), std::string::npos);
  auto b = GgufBuilder().build();
  b[0] = 'X';
  EXPECT_NE(parse_error(b).find("not a GGUF file"), std::string::npos);
  EXPECT_NE(parse_error(GgufBuilder(1).build()).find("version 1 is not supported"),
            std::string::npos);
  EXPECT_NE(parse_error(GgufBuilder(0x03000000).build()).find("big-endian"), std::string::npos);
}

TEST(GgufBad, TruncatedAtEveryCutPoint) {
  for (const char* name : {"types.gguf", "tiny_llama.gguf"}) {
    const auto whole = read_bytes(fixture(name));
    ASSERT_GT(whole.size(), 1000u) << name;
    auto f = parse(whole, name);
    ASSERT_TRUE(f.ok()) << f.message();
    size_t data_start = whole.size(), data_end = 0;
    for (const GgufTensorInfo& t : f->tensors()) {
      data_start = std::min(data_start, static_cast<size_t>(t.data - whole.data()));
      data_end = std::max(data_end, static_cast<size_t>(t.data - whole.data()) + t.nbytes);
    }
    int checked = 0;
    // Every cut inside header, metadata and infos; then every 61st byte of the data (a cut in the
    // padding after the last tensor leaves a valid file).
    for (size_t cut = 0; cut < data_end; cut += cut < data_start ? 1 : 61) {
      std::vector<uint8_t> b(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(cut));
      auto r = parse(b, name);
      ASSERT_FALSE(r.ok()) << name << " cut at " << cut;
      ASSERT_EQ(r.message().rfind(std::string(name) + ": ", 0), 0u) << r.message();
      ++checked;
    }
    EXPECT_GT(checked, 300) << name;
  }
}

TEST(GgufBad, LyingCounts) {
  auto e = parse_error(GgufBuilder().kv_u32("a", 1).lie_kv_count(uint64_t{1} << 60).build());
  EXPECT_NE(e.find("metadata count 1152921504606846976"), std::string::npos) << e;
  e = parse_error(
      GgufBuilder().tensor_f32("w", {1}, {1}).lie_tensor_count(uint64_t{1} << 60).build());
  EXPECT_NE(e.find("tensor count"), std::string::npos) << e;
  // 2^60 strings in an array.
  std::vector<uint8_t> v;
  GgufBuilder::put_u32(v, 8);
  GgufBuilder::put_u64(v, uint64_t{1} << 60);
  e = parse_error(GgufBuilder().kv_raw("tokens", 9, v).build());
  EXPECT_NE(e.find("metadata key 'tokens': array length"), std::string::npos) << e;
  // 2^61 u64 elements.
  v.clear();
  GgufBuilder::put_u32(v, 10);
  GgufBuilder::put_u64(v, uint64_t{1} << 61);
  EXPECT_FALSE(parse(GgufBuilder().kv_raw("big", 9, v).build()).ok());
  // One element more than the bytes hold.
  v.clear();
  GgufBuilder::put_u32(v, 4);
  GgufBuilder::put_u64(v, 3);
  GgufBuilder::put_u32(v, 1);
  GgufBuilder::put_u32(v, 2);
  e = parse_error(GgufBuilder().kv_raw("short", 9, v).build());
  EXPECT_NE(e.find("'short'"), std::string::npos) << e;
}

TEST(GgufBad, LyingStringLengths) {
  auto e = parse_error(GgufBuilder().kv_raw("s", 8, u64_bytes(uint64_t{1} << 63)).build());
  EXPECT_NE(e.find("metadata key 's': string value has length 9223372036854775808"),
            std::string::npos)
      << e;
  // A key whose length runs past the end.
  std::vector<uint8_t> b = GgufBuilder().build();
  b[16] = 1;  // kv_count = 1
  GgufBuilder::put_u64(b, 1000);
  b.resize(b.size() + 20);  // enough bytes for the count check, not for the key
  e = parse_error(b);
  EXPECT_NE(e.find("key has length 1000"), std::string::npos) << e;
  // A tensor name that does.
  b = GgufBuilder().tensor_f32("w", {1}, {1}).build();
  std::memset(b.data() + 24, 0xff, 8);
  EXPECT_NE(parse_error(b).find("tensor name has length"), std::string::npos);
}

TEST(GgufBad, DataOffsets) {
  // Past the end of the file.
  auto e = parse_error(GgufBuilder().tensor("w", {8}, 0, {}, 1024).build());
  EXPECT_NE(e.find("tensor 'w' has data [1024, +32) past the end"), std::string::npos) << e;
  // Misaligned.
  e = parse_error(GgufBuilder().tensor("w", {1}, 0, {0, 0, 0, 0}, 4).build());
  EXPECT_NE(e.find("tensor 'w' has data offset 4, not a multiple of the alignment 32"),
            std::string::npos)
      << e;
  // offset + nbytes overflows u64.
  e = parse_error(GgufBuilder().tensor("w", {8}, 0, {}, -32 & 0x7fffffffffffffe0).build());
  EXPECT_NE(e.find("past the end"), std::string::npos) << e;
  // The data section itself would start past the end (file cut right after the infos).
  auto b = GgufBuilder().tensor_f32("w", {1}, {1}).build();
  auto f = parse(b);
  ASSERT_TRUE(f.ok());
  const size_t infos_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
  b.resize(infos_end + 1);
  EXPECT_NE(parse_error(b).find("data section would start at byte 64"), std::string::npos);
}

TEST(GgufBad, Alignment) {
  auto e = parse_error(GgufBuilder().alignment(48).build());
  EXPECT_NE(e.find("'general.alignment' is 48, not a power of two"), std::string::npos) << e;
  EXPECT_FALSE(parse(GgufBuilder().alignment(0).build()).ok());
  e = parse_error(GgufBuilder().kv_raw("general.alignment", 0, {32}).build());
  EXPECT_NE(e.find("'general.alignment' is u8, expected u32"), std::string::npos) << e;
}

TEST(GgufBad, ValueTypes) {
  auto e = parse_error(GgufBuilder().kv_raw("k", 13, {0}).build());
  EXPECT_NE(e.find("metadata key 'k': has unknown value type 13"), std::string::npos) << e;
  std::vector<uint8_t> v;
  GgufBuilder::put_u32(v, 77);
  GgufBuilder::put_u64(v, 1);
  e = parse_error(GgufBuilder().kv_raw("k", 9, v).build());
  EXPECT_NE(e.find("unknown element type 77"), std::string::npos) << e;
  v.clear();
  GgufBuilder::put_u32(v, 9);  // array of arrays
  GgufBuilder::put_u64(v, 1);
  GgufBuilder::put_u32(v, 4);
  GgufBuilder::put_u64(v, 0);
  e = parse_error(GgufBuilder().kv_raw("k", 9, v).build());
  EXPECT_NE(e.find("metadata key 'k': array of arrays"), std::string::npos) << e;
  e = parse_error(GgufBuilder().kv_raw("b", 7, {2}).build());
  EXPECT_NE(e.find("bool value is 2"), std::string::npos) << e;
  e = parse_error(GgufBuilder().kv_raw("u", 10, u64_bytes(~uint64_t{0})).build());
  EXPECT_NE(e.find("metadata key 'u': u64 value 18446744073709551615"), std::string::npos) << e;
  e = parse_error(GgufBuilder().kv_raw("", 4, {1, 0, 0, 0}).build());
  EXPECT_NE(e.find("key is empty"), std::string::npos) << e;
}

TEST(GgufBad, Duplicates) {
  auto e = parse_error(GgufBuilder().kv_u32("a", 1).kv_u32("a", 2).build());
  EXPECT_NE(e.find("metadata key 'a': appears twice"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor_f32("w", {1}, {1}).tensor_f32("w", {1}, {2}).build());
  EXPECT_NE(e.find("tensor 'w' appears twice"), std::string::npos) << e;
}

TEST(GgufBad, TensorInfos) {
  auto e = parse_error(GgufBuilder().tensor("w", {4}, 99, std::vector<uint8_t>(16)).build());
  EXPECT_NE(e.find("tensor 'w': has unknown ggml type 99"), std::string::npos) << e;
  EXPECT_FALSE(parse(GgufBuilder().tensor("w", {4}, 4, std::vector<uint8_t>(16)).build()).ok());
  e = parse_error(GgufBuilder().tensor("w", {}, 0, {}).build());
  EXPECT_NE(e.find("tensor 'w': has 0 dimensions"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor("w", {1, 1, 1, 1, 1}, 0, {0, 0, 0, 0}).build());
  EXPECT_NE(e.find("has 5 dimensions"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor("w", {uint64_t{1} << 31, uint64_t{1} << 31}, 0, {}).build());
  EXPECT_NE(e.find("byte size over 2^63"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, {}).build());
  EXPECT_NE(e.find("more than 2^63 - 1 elements"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor("w", {uint64_t{1} << 63}, 0, {}).build());
  EXPECT_NE(e.find("dimension 0 is 9223372036854775808"), std::string::npos) << e;
  e = parse_error(GgufBuilder().tensor("w", {16}, 2, std::vector<uint8_t>(18)).build());  // Q4_0
  EXPECT_NE(e.find("ne[0] = 16, not a multiple of the 32-element blocks of Q4_0"),
            std::string::npos)
      << e;
}

// Random byte flips of a valid file: parse and dequantise whatever is accepted; never crash.
TEST(GgufBad, RandomMutationsNeverCrash) {
  const auto whole = read_bytes(fixture("types.gguf"));
  std::mt19937_64 rng(1234);
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = whole;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly the header / metadata / infos region, where the structure lives.
      const size_t at = rng() % (rng() % 4 ? std::min<size_t>(b.size(), 1200) : b.size());
      b[at] = static_cast<uint8_t>(rng() % 3 == 0 ? 0xff : rng());
    }
    auto f = parse(b);
    if (!f.ok()) continue;
    ++accepted;
    for (const GgufTensorInfo& t : f->tensors()) {
      auto d = f->dequantize(t);
      if (d.ok()) ASSERT_EQ(d->numel() > 0, t.nbytes > 0);
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace miles
