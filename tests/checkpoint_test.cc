// Safetensors IO: round trips through the atomic writer, every malformed-file error (naming the
// file and the tensor), TensorMap lookups, and the HF test models under tests/data/models.
#include "miles/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "miles/json_text.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;

// A fresh temporary directory per test, removed afterwards.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("miles_ckpt_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }
  fs::path dir_;
};

// A safetensors image: little-endian header length, header text, data bytes.
std::string image(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  return s + header + data;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Result<TensorMap> parse(const std::string& bytes, const std::string& source) {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), source,
                           nullptr);
}

// Expects parsing `bytes` to fail with a message holding the source and each of `needles`.
void expect_bad(const std::string& bytes, std::initializer_list<std::string> needles) {
  const std::string source = "/data/bad.safetensors";
  auto r = parse(bytes, source);
  ASSERT_FALSE(r.ok()) << "accepted; expected an error mentioning " << *needles.begin();
  EXPECT_NE(r.message().find(source), std::string::npos) << r.message();
  for (const auto& n : needles) EXPECT_NE(r.message().find(n), std::string::npos) << r.message();
}

const std::string k8Floats(32, '\x01');

TEST_F(CheckpointTest, RoundTripKeepsOrderDtypesAndMetadata) {
  Tensor f32 = Tensor::from_f32({2, 3}, {1, -2, 3.5f, 0, 1e-3f, 7});
  Tensor bf16 = Tensor::zeros(DType::kBF16, {3});
  for (int i = 0; i < 3; ++i) bf16.mutable_data<uint16_t>()[i] = f32_to_bf16(0.5f * (i + 1));
  Tensor i32 = Tensor::zeros(DType::kI32, {2, 2});
  for (int i = 0; i < 4; ++i) i32.mutable_data<int32_t>()[i] = -7 + 1000 * i;
  Tensor empty = Tensor::zeros(DType::kF32, {0, 4});
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"z.last_name_first", f32}, {"b.bf16", bf16}, {"a.i32", i32}, {"empty", empty}};
  const std::string file = path("out.safetensors");
  ASSERT_TRUE(write_safetensors(file, tensors, {{"format", "pt"}}).ok());
  EXPECT_EQ(listing(), std::vector<std::string>{"out.safetensors"});  // no temporary left

  auto r = read_safetensors(file);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->size(), 4u);
  for (const auto& [name, t] : tensors) {
    const Tensor* got = r->find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->dtype(), t.dtype()) << name;
    EXPECT_EQ(got->shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(got->raw(), t.raw(), t.nbytes()), 0) << name;
    EXPECT_EQ(r->source(name), file);
  }
  EXPECT_EQ(r->find("b.bf16")->to_f32(), (std::vector<float>{0.5f, 1.0f, 1.5f}));

  auto meta = read_safetensors_metadata(file);
  ASSERT_TRUE(meta.ok()) << meta.message();
  EXPECT_EQ(*meta, (std::map<std::string, std::string>{{"format", "pt"}}));

  // Header padded to 8 bytes; tensors in the given order, data contiguous in that order.
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes.substr(8, n);
  EXPECT_LT(header.find("__metadata__"), header.find("z.last_name_first"));
  EXPECT_LT(header.find("z.last_name_first"), header.find("b.bf16"));
  EXPECT_LT(header.find("b.bf16"), header.find("a.i32"));
  EXPECT_NE(header.find("\"data_offsets\":[24,30]"), std::string::npos) << header;
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 6 + 16);
}

TEST_F(CheckpointTest, ViewsKeepTheMappingAlive) {
  const std::string file = path("a.safetensors");
  ASSERT_TRUE(write_safetensors(file, {{"w", Tensor::from_f32({2}, {3, 4})}}).ok());
  Tensor kept;
  {
    auto r = read_safetensors(file);
    ASSERT_TRUE(r.ok()) << r.message();
    kept = *r->find("w");
  }
  fs::remove(file);
  EXPECT_EQ(kept.to_f32(), (std::vector<float>{3, 4}));
}

TEST_F(CheckpointTest, FailedWriteLeavesNothingBehind) {
  const Tensor t = Tensor::from_f32({1}, {1});
  Status s = write_safetensors(path("no/such/dir/x.safetensors"), {{"w", t}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos) << s.message();
  EXPECT_TRUE(listing().empty());
  // The temporary is written, but renaming it over a directory fails: it must be removed.
  fs::create_directories(path("occupied") + "/inner");
  s = write_safetensors(path("occupied"), {{"w", t}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(listing(), std::vector<std::string>{"occupied"});
  EXPECT_FALSE(write_safetensors(path("dup.safetensors"), {{"w", t}, {"w", t}}).ok());
  EXPECT_FALSE(write_safetensors(path("dup.safetensors"), {{"__metadata__", t}}).ok());
  EXPECT_EQ(listing(), std::vector<std::string>{"occupied"});
}

TEST_F(CheckpointTest, MalformedFilesOnDisk) {
  write_bytes(path("short.safetensors"), "abc");
  auto r = read_safetensors(path("short.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find(path("short.safetensors")), std::string::npos) << r.message();
  write_bytes(path("empty.safetensors"), "");
  EXPECT_FALSE(read_safetensors(path("empty.safetensors")).ok());
  EXPECT_FALSE(read_safetensors_metadata(path("empty.safetensors")).ok());
  r = read_safetensors(path("absent.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("absent.safetensors"), std::string::npos) << r.message();
  EXPECT_FALSE(read_safetensors(dir_.string()).ok());  // a directory
}

TEST(SafetensorsParse, MalformedImages) {
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}})";
  ASSERT_TRUE(parse(image(ok_header, k8Floats), "x").ok());
  expect_bad("1234567", {"too short"});
  expect_bad(image(ok_header, k8Floats).substr(0, 20), {"header length"});  // truncated
  std::string huge = image(ok_header, k8Floats);
  huge[6] = 1;  // 2^48 bytes
  expect_bad(huge, {"100 MB"});
  expect_bad(image("{\"w\": [1,", ""), {"not valid JSON"});
  expect_bad(image("[1, 2]", ""), {"not a JSON object"});
  expect_bad(image(R"({"w":{"dtype":"Q7","shape":[2,4],"data_offsets":[0,32]}})", k8Floats),
             {"'w'", "Q7"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,-4],"data_offsets":[0,32]}})", k8Floats),
             {"'w'", "shape"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,4.5],"data_offsets":[0,32]}})", k8Floats),
             {"'w'", "shape"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,32]}})",
                   k8Floats),
             {"'w'", "overflow"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[32,0]}})", k8Floats),
             {"'w'", "reversed"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[8,40]}})", k8Floats),
             {"'w'", "past the end"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,32]}})", k8Floats),
             {"'w'", "needs 24"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[2,4]}})", k8Floats), {"'w'", "data_offsets"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                      "v":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                   k8Floats),
             {"'v'", "overlaps", "'w'"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                      "v":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})",
                   k8Floats),
             {"'v'", "hole"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", k8Floats),
             {"cover 16"});
  expect_bad(image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},
                      "w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})",
                   k8Floats),
             {"'w'", "twice"});
  expect_bad(image(R"({"__metadata__":{"a":1}})", ""), {"__metadata__"});
  // Nested past parse_json_text's bound: refused before nlohmann parses (and later copies) it.
  expect_bad(
      image(R"({"__metadata__":)" + std::string(100000, '[') + std::string(100000, ']') + "}", ""),
      {"not valid JSON", "nest more than 512 levels deep"});
}

// The depth bound counts brackets outside strings only, escaped quotes included.
TEST(JsonText, DepthCountsBracketsOutsideStrings) {
  EXPECT_TRUE(json_depth_ok(R"([[1]])", 2));
  EXPECT_FALSE(json_depth_ok(R"([[[1]]])", 2));
  EXPECT_FALSE(json_depth_ok(R"({"a":{"b":[1]}})", 2));
  EXPECT_TRUE(json_depth_ok(R"(["[[[[", {"k\"[[": "\\"}, "]]]]"])", 2));
  EXPECT_FALSE(
      json_depth_ok(R"(["\\", [[1]]])", 2));  // the string ends after its escaped backslash
  EXPECT_TRUE(json_depth_ok(std::string(512, '[') + std::string(512, ']')));
  const auto deep = parse_json_text(std::string(513, '[') + std::string(513, ']'));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.message(), "arrays and objects nest more than 512 levels deep");
  EXPECT_TRUE(
      parse_json_or_discarded(std::string(513, '[') + std::string(513, ']')).is_discarded());
  EXPECT_TRUE(parse_json_text(std::string(512, '[') + std::string(512, ']')).ok());
}

TEST(SafetensorsParse, MisalignedTensorIsCopied) {
  // A 1-element BF16 tensor first puts the F32 tensor at an odd 2-byte offset.
  const std::string header = R"({"h":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})";
  std::string data(6, '\0');
  const float v = 2.5f;
  std::memcpy(&data[2], &v, 4);
  std::string padded = image(std::string(header) + std::string(8 - header.size() % 8, ' '), data);
  auto r = parse(padded, "m");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->find("f")->raw()) % 4, 0u);
  EXPECT_EQ(r->find("f")->to_f32(), std::vector<float>{2.5f});
}

// The fuzzer's committed seeds (tests/fuzz/make_seeds.py) are valid files.
TEST(SafetensorsParse, FuzzSeedsAreValid) {
  const fs::path seeds = test::source_dir() + "/tests/fuzz/corpus/safetensors";
  int n = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto r = parse(bytes, e.path().string());
    EXPECT_TRUE(r.ok()) << r.message();
    ++n;
  }
  EXPECT_GE(n, 3);
}

TEST(TensorMapTest, GetNamesTensorFileAndShapes) {
  TensorMap m;
  m.insert("model.layers.0.self_attn.q_proj.weight", Tensor::zeros(DType::kF32, {64, 32}),
           "/path/model.safetensors");
  auto wrong = m.get("model.layers.0.self_attn.q_proj.weight", {64, 64});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.message(),
            "tensor 'model.layers.0.self_attn.q_proj.weight' in /path/model.safetensors has shape "
            "[64, 32], expected [64, 64]");
  auto missing = m.get("lm_head.weight", {1});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.message(), "tensor 'lm_head.weight' missing from /path/model.safetensors");
  m.insert("x", Tensor::zeros(DType::kF32, {1}), "/path/other.safetensors");
  EXPECT_EQ(m.get("y", {1}).message(), "tensor 'y' missing from /path");
  EXPECT_TRUE(m.get("x", {1}).ok());
  EXPECT_EQ(m.names(), (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight", "x"}));
}

TEST_F(CheckpointTest, HfDirectoryErrors) {
  auto r = read_hf_weights(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find(dir_.string()), std::string::npos) << r.message();
  const Tensor t = Tensor::from_f32({1}, {1});
  ASSERT_TRUE(write_safetensors(path("s1.safetensors"), {{"a", t}, {"b", t}}).ok());
  ASSERT_TRUE(write_safetensors(path("s2.safetensors"), {{"b", t}}).ok());
  auto index = [&](const std::string& map) {
    write_bytes(path("model.safetensors.index.json"), "{\"weight_map\": " + map + "}");
    return read_hf_weights(dir_.string());
  };
  r = index(R"({"a": "s1.safetensors", "b": "s2.safetensors"})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("'b'"), std::string::npos) << r.message();  // in s1 and s2
  r = index(R"({"a": "s1.safetensors", "c": "s1.safetensors"})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("'c'"), std::string::npos) << r.message();
  r = index(R"({"a": "s3.safetensors"})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("s3.safetensors"), std::string::npos) << r.message();
  EXPECT_FALSE(index(R"({"a": "../s1.safetensors"})").ok());
  EXPECT_FALSE(index(R"([1])").ok());
  fs::remove(path("s2.safetensors"));
  r = index(R"({"a": "s1.safetensors", "b": "s1.safetensors"})");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->names(), (std::vector<std::string>{"a", "b"}));
}

// The HF test models written by transformers (tests/data/models), when present.
Result<TensorMap> read_model(const std::string& name) {
  return read_hf_weights(test::data_dir() + "/models/" + name);
}
bool have_model(const std::string& name) {
  return fs::exists(test::data_dir() + "/models/" + name + "/config.json");
}

TEST(HfModels, LlamaShapesMatchConfig) {
  if (!have_model("llama")) GTEST_SKIP() << "tests/data/models/llama not present";
  auto w = read_model("llama");
  ASSERT_TRUE(w.ok()) << w.message();
  auto c = load_model_config(test::data_dir() + "/models/llama/config.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE(w->get("model.embed_tokens.weight", {c->vocab_size, c->hidden_size}).ok());
  for (int64_t l = 0; l < c->num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto q = w->get(p + "self_attn.q_proj.weight", {c->q_dim(), c->hidden_size});
    EXPECT_TRUE(q.ok()) << q.message();
    auto k = w->get(p + "self_attn.k_proj.weight", {c->kv_dim(), c->hidden_size});
    EXPECT_TRUE(k.ok()) << k.message();
    auto d = w->get(p + "mlp.down_proj.weight", {c->hidden_size, c->intermediate_size});
    EXPECT_TRUE(d.ok()) << d.message();
  }
  EXPECT_EQ(w->find("model.norm.weight")->dtype(), DType::kF32);
}

TEST(HfModels, Qwen3Bf16) {
  if (!have_model("qwen3_bf16")) GTEST_SKIP() << "tests/data/models/qwen3_bf16 not present";
  auto w = read_model("qwen3_bf16");
  ASSERT_TRUE(w.ok()) << w.message();
  ASSERT_TRUE(w->contains("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_EQ(w->find("model.embed_tokens.weight")->dtype(), DType::kBF16);
  for (const auto& name : w->names()) EXPECT_FALSE(w->find(name)->to_f32().empty()) << name;
}

TEST(HfModels, ShardedEqualsSingleFile) {
  if (!have_model("llama_sharded") || !have_model("llama")) GTEST_SKIP() << "models not present";
  auto single = read_model("llama");
  auto sharded = read_model("llama_sharded");
  ASSERT_TRUE(single.ok()) << single.message();
  ASSERT_TRUE(sharded.ok()) << sharded.message();
  ASSERT_EQ(sharded->names(), single->names());
  for (const auto& name : single->names()) {
    const Tensor* a = single->find(name);
    const Tensor* b = sharded->find(name);
    ASSERT_EQ(a->shape(), b->shape()) << name;
    EXPECT_EQ(a->to_f32(), b->to_f32()) << name;
  }
  EXPECT_NE(sharded->source("model.embed_tokens.weight"), sharded->source("lm_head.weight"));
}

TEST(HfModels, EveryModelDirectoryReads) {
  const fs::path root = test::data_dir() + "/models";
  if (!fs::exists(root)) GTEST_SKIP() << root << " not present";
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "config.json")) continue;
    auto w = read_hf_weights(e.path().string());
    EXPECT_TRUE(w.ok()) << w.message();
    if (w.ok()) {
      EXPECT_GT(w->size(), 0u) << e.path();
    }
  }
}

}  // namespace
}  // namespace miles
