// Disk-delta transport: round trips over a chain of versions (stepwise and late-joining readers end
// bit-identical to the writer), a real checkpoint through AdamW steps whose received weights give
// the same logits bit for bit, corruption of every kind reported by name with the reader's weights
// untouched, hostile manifest sizes refused before allocation, a writer process SIGKILLed before
// its rename, and publish bandwidth on 64 MB.
#include "miles/weight_sync/disk_delta.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/trainer/optimizer.h"
#include "miles/weight_sync/weight_sync.h"
#include "test_paths.h"
#include "weight_sync/disk_delta_format.h"
#include "weight_sync/xxh3.h"

namespace miles {
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "miles_disk_delta_XXXXXX").string();
    MILES_CHECK(::mkdtemp(t.data()) != nullptr, "mkdtemp");
    path_ = t;
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

NamedTensor random_tensor(std::mt19937& rng, std::string name, std::vector<int64_t> shape) {
  std::normal_distribution<float> nd(0.f, 0.02f);
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  NamedTensor t{std::move(name), "F32", std::move(shape), std::vector<uint8_t>(n * 4)};
  std::memcpy(t.bytes.data(), v.data(), n * 4);
  return t;
}

// `count` float tensors of `rows` x 256 (rows * 1 KiB each).
WeightSet synthetic_set(std::mt19937& rng, int count, int64_t rows) {
  WeightSet s;
  for (int i = 0; i < count; ++i)
    s.push_back(
        random_tensor(rng, "model.layers." + std::to_string(i) + ".mlp.weight", {rows, 256}));
  return s;
}

// Like an optimizer step on a few tensors: `fraction` of the values of each chosen tensor move a
// little.
void perturb(WeightSet& s, std::mt19937& rng, int tensors, double fraction) {
  std::uniform_int_distribution<size_t> pick(0, s.size() - 1);
  std::normal_distribution<float> step(0.f, 1e-4f);
  for (int k = 0; k < tensors; ++k) {
    NamedTensor& t = s[pick(rng)];
    float* v = reinterpret_cast<float*>(t.bytes.data());
    const size_t n = t.bytes.size() / 4;
    std::uniform_int_distribution<size_t> at(0, n - 1);
    for (size_t j = 0; j < std::max<size_t>(1, n * fraction); ++j) v[at(rng)] += step(rng);
  }
}

void expect_same(const WeightSet& a, const WeightSet& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << what;
    EXPECT_EQ(a[i].dtype, b[i].dtype) << what;
    EXPECT_EQ(a[i].shape, b[i].shape) << what;
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << what << ": tensor " << a[i].name << " differs";
  }
}

int64_t dir_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += static_cast<int64_t>(e.file_size());
  return n;
}

void check_chain(DeltaEncoding enc, int full_every,
                 DeltaCompression compression = DeltaCompression::kSmall) {
  TempDir tmp;
  std::mt19937 rng(7);
  WeightSet w = synthetic_set(rng, 16, 128);  // 16 x 128 KiB = 2 MiB
  DiskDeltaOptions options;
  options.full_every = full_every;
  options.encoding = enc;
  options.compression = compression;
  DiskDeltaWriter writer(tmp.path(), options);
  DiskDeltaReader reader(tmp.path());
  const std::vector<int64_t> versions = {1, 2, 4, 5, 9};  // gaps are fine; order is what counts
  std::vector<WeightSet> want;
  WeightSet stepper;
  int64_t stepper_version = -1;
  int64_t full_bytes = 0, delta_bytes = 0, deltas = 0;
  for (size_t k = 0; k < versions.size(); ++k) {
    if (k > 0) perturb(w, rng, 3, 0.01);
    auto st = writer.publish(versions[k], w);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(st->base_version.has_value(), k % full_every != 0) << versions[k];
    const int64_t on_disk = dir_bytes(tmp.sub(disk_delta::version_dir_name(versions[k])));
    if (st->base_version) {
      delta_bytes += on_disk;
      ++deltas;
      EXPECT_LE(st->tensors_stored, 3);
    } else {
      full_bytes = on_disk;
    }
    want.push_back(w);
    // A reader stepping along: from nothing (load), then advance by one version each time; the
    // checksums it hands back are its tensors' hashes.
    std::vector<std::string> sums;
    if (stepper_version < 0) {
      auto l = reader.load(versions[k], &sums);
      ASSERT_TRUE(l.ok()) << l.message();
      stepper = std::move(*l);
    } else {
      Status s = reader.advance(stepper, stepper_version, versions[k], &sums);
      ASSERT_TRUE(s.ok()) << s.message();
    }
    stepper_version = versions[k];
    expect_same(stepper, w, "stepping reader at version " + std::to_string(versions[k]));
    ASSERT_EQ(sums.size(), stepper.size());
    for (size_t i = 0; i < sums.size(); ++i)
      EXPECT_EQ(sums[i], disk_delta::xxh3_128_hex(stepper[i].bytes)) << stepper[i].name;
  }
  // Late joiners: from the latest full version, and from scratch at every version.
  auto latest = reader.latest_version();
  auto full = reader.latest_full_version();
  ASSERT_TRUE(latest.ok() && full.ok());
  EXPECT_EQ(*latest, 9);
  EXPECT_EQ(*full, full_every == 10 ? 1 : 9);
  auto late = reader.load(*full);
  ASSERT_TRUE(late.ok()) << late.message();
  ASSERT_TRUE(reader.advance(*late, *full, *latest).ok());
  expect_same(*late, want.back(), "late joiner");
  for (size_t k = 0; k < versions.size(); ++k) {
    auto l = reader.load(versions[k]);
    ASSERT_TRUE(l.ok()) << l.message();
    expect_same(*l, want[k], "load(" + std::to_string(versions[k]) + ")");
  }
  if (deltas > 0) {
    const double ratio = double(delta_bytes) / deltas / full_bytes;
    std::printf(
        "[%s, full_every %d] full version %lld bytes, mean delta %lld bytes (3 of 16 tensors, 1%% "
        "of values): delta/full = %.4f\n",
        enc == DeltaEncoding::kDifference ? "difference"
        : enc == DeltaEncoding::kXor      ? "xor"
                                          : "overwrite",
        full_every, (long long)full_bytes, (long long)(delta_bytes / deltas), ratio);
    if (enc != DeltaEncoding::kOverwrite) {
      EXPECT_LT(ratio, 0.1);
    }
  }
}

TEST(DiskDelta, RoundTripDifference) { check_chain(DeltaEncoding::kDifference, 10); }
TEST(DiskDelta, RoundTripXor) { check_chain(DeltaEncoding::kXor, 10); }
TEST(DiskDelta, RoundTripOverwrite) { check_chain(DeltaEncoding::kOverwrite, 10); }
TEST(DiskDelta, RoundTripFullEveryTwo) { check_chain(DeltaEncoding::kDifference, 2); }
TEST(DiskDelta, RoundTripFastCompression) {
  check_chain(DeltaEncoding::kDifference, 10, DeltaCompression::kFast);
  check_chain(DeltaEncoding::kXor, 10, DeltaCompression::kFast);
  check_chain(DeltaEncoding::kOverwrite, 2, DeltaCompression::kFast);
}

// kFast stores the literals raw: on float weights' byte planes (low-entropy sign/exponent bytes,
// near-random mantissa bytes) its files are larger than kSmall's, and any reader loads a directory
// holding versions of both.
TEST(DiskDelta, FastCompressionIsLargerAndReadersReadBothInOneDirectory) {
  TempDir tmp;
  std::mt19937 rng(11);
  WeightSet w = synthetic_set(rng, 8, 128);
  DiskDeltaOptions small, fast;
  fast.compression = DeltaCompression::kFast;
  auto v1 = DiskDeltaWriter(tmp.path(), small).publish(1, w);
  ASSERT_TRUE(v1.ok()) << v1.message();
  const WeightSet first = w;
  perturb(w, rng, 8, 0.5);
  auto v2 = DiskDeltaWriter(tmp.path(), fast).publish(2, w);  // a new writer: a full version
  ASSERT_TRUE(v2.ok()) << v2.message();
  EXPECT_FALSE(v2->base_version.has_value());
  EXPECT_GT(v2->bytes_written, v1->bytes_written * 103 / 100)  // synthetic N(0, 0.02): 1.07x
      << "small " << v1->bytes_written << ", fast " << v2->bytes_written;
  DiskDeltaReader reader(tmp.path());
  auto l1 = reader.load(1);
  ASSERT_TRUE(l1.ok()) << l1.message();
  expect_same(*l1, first, "load(1), small");
  auto l2 = reader.load(2);
  ASSERT_TRUE(l2.ok()) << l2.message();
  expect_same(*l2, w, "load(2), fast");
  ASSERT_TRUE(reader.advance(*l1, 1, 2).ok());
  expect_same(*l1, w, "advance(1 -> 2) across the two");
}

// difference on every element size the format has: 2 (BF16, F16, I16), 4 (F32, I32) and 8 (F64,
// I64) bytes, with values that wrap around (sign flips, the largest and smallest integers, NaN and
// infinity bit patterns); 1-byte tensors (U8, BOOL) get xor. A reader stepping along and one
// loading from nothing get the new bytes exactly; the manifest says which tensor got which
// encoding.
TEST(DiskDelta, DifferenceRoundTripsEveryElementSizeAndWrapsAround) {
  TempDir tmp;
  std::mt19937_64 rng(13);
  WeightSet w;
  for (const auto& [dtype, elem] : std::vector<std::pair<std::string, int>>{{"BF16", 2},
                                                                            {"F16", 2},
                                                                            {"I16", 2},
                                                                            {"F32", 4},
                                                                            {"I32", 4},
                                                                            {"F64", 8},
                                                                            {"I64", 8},
                                                                            {"U8", 1},
                                                                            {"BOOL", 1}}) {
    NamedTensor t{dtype, dtype, {4099}, std::vector<uint8_t>(4099 * elem)};  // a ragged tail
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
    w.push_back(std::move(t));
  }
  DiskDeltaWriter writer(tmp.path());  // difference is the default
  ASSERT_TRUE(writer.publish(1, w).ok());
  const WeightSet first = w;
  for (NamedTensor& t : w) {
    const size_t elem = t.bytes.size() / 4099;
    for (size_t i = 0; i < t.bytes.size(); i += elem) {
      const uint64_t r = rng();
      if (r % 3 == 0) continue;  // unchanged
      uint64_t v = 0;
      std::memcpy(&v, &t.bytes[i], elem);
      if (r % 7 == 0)
        v = ~v;  // far: the sign and every byte
      else if (r % 11 == 0)
        v = uint64_t{1} << (8 * elem - 1);  // the smallest integer / -0.0
      else if (r % 13 == 0)
        v = (v & 1) ? 0 : ~uint64_t{0};  // zero / all ones (NaN)
      else
        v += (r >> 8) % 2001 - 1000;  // a few units in the last place, either way
      std::memcpy(&t.bytes[i], &v, elem);
    }
  }
  auto st = writer.publish(2, w);
  ASSERT_TRUE(st.ok()) << st.message();
  nlohmann::json m = nlohmann::json::parse(std::ifstream(tmp.sub("weight_v000002/manifest.json")));
  ASSERT_EQ(m["format_version"], 3);
  for (const auto& t : m["tensors"])
    EXPECT_EQ(t["encoding"], t["dtype"] == "U8" || t["dtype"] == "BOOL" ? "xor" : "difference")
        << t["name"];
  DiskDeltaReader reader(tmp.path());
  auto loaded = reader.load(2);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  expect_same(*loaded, w, "load(2)");
  WeightSet stepping = first;
  ASSERT_TRUE(reader.advance(stepping, 1, 2).ok());
  expect_same(stepping, w, "advance(1 -> 2)");
}

// What difference is for: an optimizer step moves every float weight by a few units in its last
// place, whose xor flips carry chains into the high bytes; the difference leaves them zero. On
// N(0, 0.02) weights each moved by +-1e-6 (an Adam step's size at lr 1e-6), the difference's delta
// is smaller than the xor's (0.79x after the first RL step of SmolLM2, docs/benchmarks.md).
TEST(DiskDelta, DifferenceOfAnUpdateIsSmallerThanItsXor) {
  std::mt19937 rng(17);
  WeightSet w = synthetic_set(rng, 8, 256), next = w;
  for (NamedTensor& t : next) {
    float* v = reinterpret_cast<float*>(t.bytes.data());
    for (size_t i = 0; i < t.bytes.size() / 4; ++i) v[i] += rng() & 1 ? 1e-6f : -1e-6f;
  }
  uint64_t bytes[2] = {};
  for (const DeltaEncoding enc : {DeltaEncoding::kDifference, DeltaEncoding::kXor}) {
    TempDir tmp;
    DiskDeltaOptions o;
    o.encoding = enc;
    DiskDeltaWriter writer(tmp.path(), o);
    ASSERT_TRUE(writer.publish(1, w).ok());
    auto st = writer.publish(2, next);
    ASSERT_TRUE(st.ok()) << st.message();
    bytes[enc == DeltaEncoding::kXor] = st->bytes_written;
    auto l = DiskDeltaReader(tmp.path()).load(2);
    ASSERT_TRUE(l.ok()) << l.message();
    expect_same(*l, next, "load(2)");
  }
  std::printf("an update's delta: difference %llu bytes, xor %llu bytes (%.3f)\n",
              (unsigned long long)bytes[0], (unsigned long long)bytes[1],
              double(bytes[0]) / bytes[1]);
  EXPECT_LT(bytes[0], bytes[1] * 85 / 100);
}

TEST(DiskDelta, ManifestNamesEveryField) {
  TempDir tmp;
  std::mt19937 rng(1);
  WeightSet w = synthetic_set(rng, 3, 4);
  DiskDeltaWriter writer(tmp.path());
  ASSERT_TRUE(writer.publish(1, w).ok());
  perturb(w, rng, 1, 0.5);
  ASSERT_TRUE(writer.publish(2, w).ok());
  std::ifstream f(tmp.sub("weight_v000002/manifest.json"));
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["base_version"], 1);
  EXPECT_EQ(j["checksum"], "xxh3-128");
  int stored = 0;
  for (const auto& t : j["tensors"]) {
    stored += t["encoding"] == "difference";
    EXPECT_TRUE(t["encoding"] == "difference" || t["encoding"] == "unchanged") << t.dump();
    EXPECT_EQ(t["xxh3_128"].get<std::string>().size(), 32u);
    if (t["encoding"] == "difference") {  // float32 is stored as byte planes (unchanged: no frame)
      EXPECT_EQ(t["layout"], "byte_planes") << t.dump();
    }
  }
  EXPECT_EQ(j["format_version"], 3);
  EXPECT_EQ(stored, 1);
  std::ifstream latest(tmp.sub("LATEST"));
  int64_t v = 0;
  latest >> v;
  EXPECT_EQ(v, 2);
  // The hex is the canonical form: high 64 bits first (xxhsum -H2).
  const std::string abc = "abc";
  const XXH128_hash_t h = XXH3_128bits(abc.data(), abc.size());
  char want[33];
  std::snprintf(want, sizeof want, "%016llx%016llx", (unsigned long long)h.high64,
                (unsigned long long)h.low64);
  EXPECT_EQ(disk_delta::xxh3_128_hex({reinterpret_cast<const uint8_t*>(abc.data()), 3}), want);
}

// A caller's precomputed checksums (known_xxh3) go into the manifest as they are: right ones give
// the same directory a hashing writer gives, a wrong one is refused by the reader, naming the
// tensor.
TEST(DiskDelta, KnownChecksumsAreUsedAndAWrongOneIsCaught) {
  std::mt19937 rng(3);
  const WeightSet w = synthetic_set(rng, 3, 4);
  TempDir a, b, c;
  ASSERT_TRUE(DiskDeltaWriter(a.path()).publish(1, w).ok());
  DiskDeltaOptions known;
  int asked = 0;
  known.known_xxh3 = [&](const std::string& name) {
    ++asked;
    for (const NamedTensor& t : w)
      if (t.name == name) return disk_delta::xxh3_128_hex(t.bytes);
    return std::string();
  };
  ASSERT_TRUE(DiskDeltaWriter(b.path(), known).publish(1, w).ok());
  EXPECT_EQ(asked, 3);
  auto manifest = [](const TempDir& d) {
    std::ifstream f(d.sub("weight_v000001/manifest.json"));
    return nlohmann::json::parse(f)["tensors"];
  };
  EXPECT_EQ(manifest(a), manifest(b));
  DiskDeltaOptions wrong;
  wrong.known_xxh3 = [&](const std::string& name) {
    return name == w[1].name ? std::string(32, '0') : std::string();
  };
  ASSERT_TRUE(DiskDeltaWriter(c.path(), wrong).publish(1, w).ok());
  auto loaded = DiskDeltaReader(c.path()).load(1);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.message().find(w[1].name), std::string::npos) << loaded.message();
}

// ---- a real checkpoint through AdamW steps ------------------------------------------------------

std::vector<float> logits_of(const Model& model) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i)
    tokens.push_back(static_cast<int32_t>((i * 37 + 5) % model.config().vocab_size));
  auto kv = model.make_kv_cache();
  SeqSpan s{0, 0, static_cast<int64_t>(tokens.size())};
  auto out = model.forward(tokens, {&s, 1}, *kv, ForwardOptions{}, nullptr);
  MILES_CHECK(out.ok(), "forward of the test tokens failed");
  return out->logits;
}

TEST(DiskDelta, RealCheckpointThroughAdamWGivesIdenticalLogits) {
  const std::string dir = test::data_dir() + "/models/llama";
  auto cfg = load_model_config(dir + "/config.json");
  auto hf = read_hf_weights(dir);
  ASSERT_TRUE(cfg.ok() && hf.ok()) << cfg.message() << hf.message();
  auto layout = ParamLayout::for_model(*cfg, &*hf);
  auto params = FlatTensors::from_tensor_map(layout, *hf);
  ASSERT_TRUE(params.ok()) << params.message();
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  AdamW opt(layout, ac);
  FlatTensors grads(layout);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);

  TempDir tmp;
  DiskDeltaWriter writer(tmp.path());
  DiskDeltaReader reader(tmp.path());
  WeightSet engine;  // what an engine holds, advanced version by version
  int64_t full_bytes = 0;
  for (int64_t v = 0; v < 4; ++v) {
    if (v > 0) {  // one AdamW step on random gradients of the first few tensors
      grads.zero();
      for (size_t i = 0; i < 3; ++i)
        for (float& g : grads.get(layout->specs()[i].name)) g = nd(rng);
      opt.step(*params, grads, 1e-3);
    }
    const WeightSet sent = weight_set_from_tensor_map(params->as_tensor_map());
    auto st = writer.publish(v, sent);
    ASSERT_TRUE(st.ok()) << st.message();
    if (v == 0) {
      full_bytes = st->bytes_written;
      engine = std::move(*reader.load(0));
    } else {
      ASSERT_TRUE(reader.advance(engine, v - 1, v).ok());
      std::printf(
          "llama version %lld: %lld of %lld tensors stored, %lld bytes, delta/full = %.3f\n",
          (long long)v, (long long)st->tensors_stored, (long long)st->tensors,
          (long long)st->bytes_written, double(st->bytes_written) / full_bytes);
    }
    expect_same(engine, sent, "engine at version " + std::to_string(v));
    // The engine's model, built from the received bytes, gives the trainer model's logits.
    auto received = tensor_map_from_weight_set(engine);
    ASSERT_TRUE(received.ok()) << received.message();
    auto got = Model::from_weights(*cfg, *received);
    auto src = Model::from_weights(*cfg, params->as_tensor_map());
    ASSERT_TRUE(got.ok() && src.ok()) << got.message() << src.message();
    const std::vector<float> a = logits_of(**got), b = logits_of(**src);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "logits differ at version " << v;
  }
}

// ---- corruption: every error names what is wrong; the reader's weights stay at the old version
// ----

class Corruption : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(11);
    WeightSet w = synthetic_set(rng, 6, 32);
    DiskDeltaWriter writer(tmp_.path());
    for (int64_t v = 1; v <= 3; ++v) {
      if (v > 1) perturb(w, rng, 2, 0.05);
      ASSERT_TRUE(writer.publish(v, w).ok());
      sets_.push_back(w);
    }
    current_ = sets_[0];
  }
  std::string vdir(int64_t v) const { return tmp_.sub(disk_delta::version_dir_name(v)); }
  nlohmann::json manifest(int64_t v) const {
    std::ifstream f(vdir(v) + "/manifest.json");
    return nlohmann::json::parse(f);
  }
  // A tensor that version v stores (not unchanged).
  nlohmann::json stored_tensor(int64_t v) const {
    const nlohmann::json m = manifest(v);
    for (const auto& t : m["tensors"])
      if (t["encoding"] != "unchanged") return t;
    return {};
  }
  void flip_byte(const std::string& path, uint64_t at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x10));
  }
  // advance(1 -> 3) fails with a message holding every piece of `want`; the weights stay at 1.
  void expect_advance_fails(const std::vector<std::string>& want) {
    DiskDeltaReader reader(tmp_.path());
    Status s = reader.advance(current_, 1, 3);
    ASSERT_FALSE(s.ok());
    std::printf("  error: %s\n", s.message().c_str());
    for (const auto& w : want) EXPECT_NE(s.message().find(w), std::string::npos) << s.message();
    expect_same(current_, sets_[0], "weights after a failed advance");
  }
  TempDir tmp_;
  std::vector<WeightSet> sets_;
  WeightSet current_;
};

TEST_F(Corruption, TruncatedDataFile) {
  const auto t = stored_tensor(2);
  const std::string data = vdir(2) + "/tensors.zst";
  fs::resize_file(data, t["offset"].get<uint64_t>() + 3);
  expect_advance_fails({"weight_v000002/tensors.zst", "truncated", t["name"].get<std::string>()});
}

TEST_F(Corruption, FlippedByteInCompressedFrame) {
  const auto t = stored_tensor(3);
  flip_byte(vdir(3) + "/tensors.zst",
            t["offset"].get<uint64_t>() + t["compressed_bytes"].get<uint64_t>() / 2);
  expect_advance_fails({"version 3", t["name"].get<std::string>()});
}

TEST_F(Corruption, FlippedByteInManifestChecksum) {
  nlohmann::json m = manifest(3);
  const std::string name = m["tensors"][4]["name"];  // any tensor: unchanged ones are verified too
  std::string h = m["tensors"][4]["xxh3_128"];
  h[7] = h[7] == '0' ? '1' : '0';
  m["tensors"][4]["xxh3_128"] = h;
  std::ofstream(vdir(3) + "/manifest.json") << m.dump(1);
  expect_advance_fails({"version 3", "checksum mismatch", name});
}

TEST_F(Corruption, ManifestGarbage) {
  std::ofstream(vdir(2) + "/manifest.json") << "{\"format\": \"miles-disk-delta\", \"tens";
  expect_advance_fails({"weight_v000002/manifest.json", "not a JSON object"});
}

TEST_F(Corruption, MissingVersionInChain) {
  fs::remove_all(vdir(2));
  expect_advance_fails({"version 2 (base of version 3) is missing"});
  auto l = DiskDeltaReader(tmp_.path()).load(3);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.message().find("version 2 (base of version 3) is missing"), std::string::npos)
      << l.message();
}

// Pruning (weight_sync.keep_versions): versions older than the newest full version at or below the
// oldest kept one go; every version from that base on still loads, a reader far behind joins from
// a full version, and a reader on the kept chain advances as before.
TEST(DiskDeltaPrune, KeepsEveryChainFromTheNewestFullBaseAtOrBelow) {
  TempDir tmp;
  EXPECT_EQ(*prune_versions(tmp.sub("not_yet"), 5), 0);  // nothing published yet
  std::mt19937 rng(11);
  WeightSet w = synthetic_set(rng, 6, 16);
  DiskDeltaOptions options;
  options.full_every = 3;  // versions 1, 4, 7, 10 full
  DiskDeltaWriter writer(tmp.path(), options);
  std::vector<WeightSet> sets;
  for (int64_t v = 1; v <= 12; ++v) {
    if (v > 1) perturb(w, rng, 3, 0.05);
    ASSERT_TRUE(writer.publish(v, w).ok()) << v;
    sets.push_back(w);
  }
  DiskDeltaReader reader(tmp.path());
  WeightSet at5 = *reader.load(5);
  EXPECT_EQ(*reader.full_version_at_or_below(9), 7);
  EXPECT_EQ(*reader.full_version_at_or_below(0), std::nullopt);
  auto removed = prune_versions(tmp.path(), 9);
  ASSERT_TRUE(removed.ok()) << removed.message();
  EXPECT_EQ(*removed, 6);
  EXPECT_EQ(*reader.versions(), (std::vector<int64_t>{7, 8, 9, 10, 11, 12}));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  for (int64_t v = 7; v <= 12; ++v) expect_same(*reader.load(v), sets[v - 1], "load after prune");
  ASSERT_TRUE(reader.advance(at5, 5, 12).ok());  // far behind: joins from version 10
  expect_same(at5, sets[11], "a reader behind the pruned versions");
  WeightSet at8 = *reader.load(8);
  ASSERT_TRUE(reader.advance(at8, 8, 9).ok());
  expect_same(at8, sets[8], "a reader on the kept chain");
  EXPECT_EQ(*prune_versions(tmp.path(), 9), 0);   // again: nothing more to remove
  EXPECT_EQ(*prune_versions(tmp.path(), 12), 3);  // 7, 8, 9 below the full version 10
  EXPECT_EQ(*reader.versions(), (std::vector<int64_t>{10, 11, 12}));
}

TEST_F(Corruption, XorOntoTheWrongBaseIsCaught) {
  // The caller claims its version-1 weights are version 2: xor lands on the wrong base.
  Status s = DiskDeltaReader(tmp_.path()).advance(current_, 2, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("version 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
  expect_same(current_, sets_[0], "weights after a failed advance");
}

TEST_F(Corruption, LeftoverTmpDirectoryIsIgnored) {
  fs::create_directory(tmp_.sub("weight_v000004.tmp-999-0"));
  std::ofstream(tmp_.sub("weight_v000004.tmp-999-0/manifest.json")) << "garbage";
  DiskDeltaReader reader(tmp_.path());
  EXPECT_EQ(*reader.versions(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(*reader.latest_version(), 3);
  ASSERT_TRUE(reader.advance(current_, 1, 3).ok());
  expect_same(current_, sets_[2], "after advance");
}

TEST_F(Corruption, ReusedOrOlderVersionIsRefused) {
  std::mt19937 rng(2);
  WeightSet w = synthetic_set(rng, 6, 32);
  DiskDeltaWriter again(tmp_.path());  // a restarted trainer
  auto r = again.publish(3, w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("version 3 is already published"), std::string::npos) << r.message();
  r = again.publish(0, w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("older than the latest published"), std::string::npos) << r.message();
  EXPECT_EQ(*DiskDeltaReader(tmp_.path()).versions(), (std::vector<int64_t>{1, 2, 3}));
  auto ok = again.publish(4, w);  // the restarted writer has no snapshot: a full version
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_FALSE(ok->base_version.has_value());
}

// ---- hostile manifests: refused with a message before anything is allocated for them ----------
// (found by tests/fuzz/fuzz_disk_delta.cc: a 2^60-byte tensor was allocated before its frame was
// read, a dimension of 2^63 or more aborted, sizes that overflow 64 bits passed the checks)

nlohmann::json hostile_tensor(const std::string& name, const std::string& dtype,
                              nlohmann::json shape, uint64_t nbytes, uint64_t offset,
                              uint64_t compressed_bytes) {
  return {{"name", name},
          {"dtype", dtype},
          {"shape", std::move(shape)},
          {"encoding", "full"},
          {"nbytes", nbytes},
          {"offset", offset},
          {"compressed_bytes", compressed_bytes},
          {"xxh3_128", std::string(32, '0')}};
}

// load(1) of a directory whose only version has these tensors and a data file of `data_bytes`.
std::string load_fails_with(nlohmann::json tensors, uint64_t data_bytes, int format_version = 1) {
  TempDir tmp;
  const std::string v = tmp.sub(disk_delta::version_dir_name(1));
  fs::create_directory(v);
  const nlohmann::json m = {{"format", "miles-disk-delta"},
                            {"format_version", format_version},
                            {"version", 1},
                            {"base_version", nullptr},
                            {"data_file", "tensors.zst"},
                            {"data_bytes", data_bytes},
                            {"checksum", "xxh3-128"},
                            {"tensors", std::move(tensors)}};
  std::ofstream(v + "/manifest.json") << m.dump(1);
  std::ofstream(v + "/tensors.zst", std::ios::binary) << std::string(data_bytes, '\0');
  auto l = DiskDeltaReader(tmp.path()).load(1);
  EXPECT_FALSE(l.ok());
  return l.ok() ? "" : l.message();
}

TEST(DiskDelta, HostileManifestSizesAreRefusedBeforeAllocating) {
  using J = nlohmann::json;
  const uint64_t big = uint64_t{1} << 60;
  // nbytes far beyond what 16 bytes of zstd can decode to, with an unknown dtype and with a shape
  // that agrees.
  std::string e =
      load_fails_with(J::array({hostile_tensor("w", "Q4X", J::array({3}), big, 0, 16)}), 16);
  EXPECT_NE(e.find("is more than a zstd frame of 16 bytes can hold"), std::string::npos) << e;
  e = load_fails_with(
      J::array({hostile_tensor("w", "F32", J::array({uint64_t{1} << 58}), big, 0, 16)}), 16);
  EXPECT_NE(e.find("is more than a zstd frame of 16 bytes can hold"), std::string::npos) << e;
  // A dimension that is not an int64, and a shape whose bytes overflow 64 bits (it used to wrap to
  // nbytes 0).
  e = load_fails_with(J::array({hostile_tensor("w", "F32", J::array({UINT64_MAX}), 4, 0, 16)}), 16);
  EXPECT_NE(e.find("'shape' has a dimension of 2^63 or more"), std::string::npos) << e;
  e = load_fails_with(
      J::array({hostile_tensor("w", "F32", J::array({uint64_t{1} << 62, 4}), 0, 0, 16)}), 16);
  EXPECT_NE(e.find("need more than 2^64 bytes"), std::string::npos) << e;
  // Frames whose sizes wrap around 2^64 back to data_bytes (the second one would start far past
  // the end of the data).
  e = load_fails_with(J::array({hostile_tensor("a", "Q4X", J::array({3}), 4, 0, UINT64_MAX),
                                hostile_tensor("b", "Q4X", J::array({3}), 4, UINT64_MAX, 2)}),
                      1);
  EXPECT_NE(e.find("ends past data_bytes 1"), std::string::npos) << e;
  // A tensor named twice (a reader's per-tensor work runs in parallel, one buffer per name).
  e = load_fails_with(J::array({hostile_tensor("a", "Q4X", J::array({3}), 4, 0, 1),
                                hostile_tensor("a", "Q4X", J::array({3}), 4, 1, 1)}),
                      2);
  EXPECT_NE(e.find("tensor 'a' appears twice"), std::string::npos) << e;
  // A frame that declares another size than nbytes is refused before the output is allocated.
  std::vector<uint8_t> frame;
  ASSERT_TRUE(disk_delta::zstd_encode_append(std::vector<uint8_t>(8, 1), nullptr,
                                             disk_delta::TensorEncoding::kFull,
                                             disk_delta::TensorLayout::kBytes, 1, 1, frame)
                  .ok());
  Status s = disk_delta::zstd_check_frame_size(frame, 1 << 20);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("zstd frame holds 8 bytes, expected 1048576"), std::string::npos)
      << s.message();
}

// Format version 2 names every tensor's layout: one missing or unknown, byte planes of 1-byte
// elements, a layout in a version 1 manifest and an unknown format version are refused by name;
// a version 1 directory (no layouts: every frame plain bytes) still loads.
TEST(DiskDelta, LayoutsAreStrictAndVersionOneStillLoads) {
  using J = nlohmann::json;
  const auto with_layout = [](J t, const std::string& layout) {
    t["layout"] = layout;
    return t;
  };
  const J f32 = hostile_tensor("w", "F32", J::array({4}), 16, 0, 16);
  std::string e = load_fails_with(J::array({f32}), 16, 2);
  EXPECT_NE(e.find("'layout'"), std::string::npos) << e;
  e = load_fails_with(J::array({with_layout(f32, "zigzag")}), 16, 2);
  EXPECT_NE(e.find("unknown layout 'zigzag'"), std::string::npos) << e;
  e = load_fails_with(
      J::array({with_layout(hostile_tensor("w", "U8", J::array({16}), 16, 0, 16), "byte_planes")}),
      16, 2);
  EXPECT_NE(e.find("'byte_planes' needs a dtype of 2 bytes or more, not 'U8'"), std::string::npos)
      << e;
  e = load_fails_with(J::array({with_layout(f32, "bytes")}), 16, 1);
  EXPECT_NE(e.find("'layout' in a format version 1 manifest"), std::string::npos) << e;
  e = load_fails_with(J::array({with_layout(f32, "bytes")}), 16, 4);
  EXPECT_NE(e.find("version 4 is not miles-disk-delta version 1 to 3"), std::string::npos) << e;
  // difference: format version 3 and byte planes only.
  J diff = with_layout(f32, "byte_planes");
  diff["encoding"] = "difference";
  e = load_fails_with(J::array({diff}), 16, 2);
  EXPECT_NE(e.find("encoding 'difference' in a format version 2 manifest"), std::string::npos) << e;
  e = load_fails_with(J::array({with_layout(diff, "bytes")}), 16, 3);
  EXPECT_NE(e.find("encoding 'difference' needs layout 'byte_planes'"), std::string::npos) << e;

  // A version written as version 1 was: 1-byte tensors (stored as bytes), the manifest without
  // layouts.
  TempDir tmp;
  WeightSet w;
  for (int i = 0; i < 3; ++i) {
    NamedTensor t{"t" + std::to_string(i), "U8", {4096}, std::vector<uint8_t>(4096)};
    for (size_t k = 0; k < t.bytes.size(); ++k) t.bytes[k] = static_cast<uint8_t>(k * (i + 3));
    w.push_back(std::move(t));
  }
  ASSERT_TRUE(DiskDeltaWriter(tmp.path()).publish(1, w).ok());
  const std::string path = tmp.sub("weight_v000001/manifest.json");
  J m = J::parse(std::ifstream(path));
  ASSERT_EQ(m["format_version"], 3);
  m["format_version"] = 1;
  for (J& t : m["tensors"]) {
    ASSERT_EQ(t["layout"], "bytes");
    t.erase("layout");
  }
  std::ofstream(path) << m.dump(1);
  auto loaded = DiskDeltaReader(tmp.path()).load(1);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  expect_same(*loaded, w, "version 1 load");
}

TEST(DiskDelta, WriterRefusesAShapeWhoseBytesOverflow) {
  TempDir tmp;
  WeightSet w = {{"w", "F32", {int64_t{1} << 62, 8}, {}}};  // 2^67 bytes: wrapped to 0 before
  auto r = DiskDeltaWriter(tmp.path()).publish(1, w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("need more than 2^64 bytes"), std::string::npos) << r.message();
}

TEST(DiskDelta, FormatChecksumIsTheWeightSyncOne) {
  // disk_delta_format.cc computes the digits itself (the format needs no engine); they must stay
  // those of miles::xxh3_128_hex, which callers pass as DiskDeltaOptions::known_xxh3.
  for (size_t n : {0, 1, 17, 4096}) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
    EXPECT_EQ(disk_delta::xxh3_128_hex(bytes), xxh3_128_hex(bytes.data(), bytes.size())) << n;
  }
}

// Our xxh3-128 loop (weight_sync/xxh3.h) against the library's one-shot XXH3_128bits: on both
// paths, every length class (empty, the library's short inputs, one byte either side of a stripe
// and a 1 KiB block, megabytes), handed over whole, in pieces of 1 byte, of a stripe, of random
// sizes small and large, hashed in place or copied (to destinations aligned to 32, 16 and 8
// bytes, whose bytes must then be the source's).
TEST(Xxh3, EveryPathLengthAndSplitGivesTheLibrarysHash) {
  std::vector<weight_sync_detail::Xxh3Stream::Path> paths = {
      weight_sync_detail::Xxh3Stream::Path::kScalar};
  if (__builtin_cpu_supports("avx2")) paths.push_back(weight_sync_detail::Xxh3Stream::Path::kAvx2);
  std::mt19937_64 rng(7);
  std::vector<uint8_t> src((3u << 20) + 100);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const std::vector<size_t> lengths = {0,    1,    17,   63,    64,    65,      127,     128,  129,
                                       239,  240,  241,  255,   256,   257,     1023,    1024, 1025,
                                       1087, 1088, 1089, 16385, 65536, 1 << 20, 3u << 20};
  auto hex_of = [](XXH128_hash_t h) {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    return std::string(buf);
  };
  alignas(64) static uint8_t dst_store[(3u << 20) + 200];
  for (const auto path : paths)
    for (const size_t len : lengths)
      for (const int split : {0, 1, 2, 3, 4})
        for (const size_t align : {0, 16, 8}) {
          if (split == 1 && len > 70'000) continue;  // byte by byte: the short ones suffice
          const size_t at = 13 * (len % 7);          // sources start anywhere
          const uint8_t* in = src.data() + at;
          const std::string want = hex_of(XXH3_128bits(in, len));
          const bool copying = align != 0 || split % 2 == 0;
          uint8_t* out = dst_store + (align == 0 ? 32 : align);
          std::memset(out, 0xEE, len);
          weight_sync_detail::Xxh3Stream h(path);
          for (size_t off = 0; off < len;) {
            size_t n = len - off;
            if (split == 1) n = 1;
            if (split == 2) n = std::min<size_t>(n, 64);
            if (split == 3) n = std::min<size_t>(n, 1 + rng() % 300);
            if (split == 4) n = std::min<size_t>(n, 1 + rng() % 400'000);
            if (copying) {
              h.copy(out + off, in + off, n);
            } else {
              h.update(in + off, n);
            }
            off += n;
          }
          const std::string where = "path " + std::to_string(static_cast<int>(path)) + " len " +
                                    std::to_string(len) + " split " + std::to_string(split) +
                                    " align " + std::to_string(align);
          EXPECT_EQ(h.bytes(), len) << where;
          EXPECT_EQ(h.hex(), want) << where;
          if (copying) {
            EXPECT_EQ(std::memcmp(out, in, len), 0) << where;
          }
        }
  EXPECT_EQ(weight_sync_detail::xxh3_hex(src.data(), src.size()),
            hex_of(XXH3_128bits(src.data(), src.size())));
}

// The reader decodes frames piece by piece (written over, or xor-applied through a piece buffer;
// a byte_planes block is one piece), reading them in chunks, and hashes the pieces as they come:
// over several pieces and a ragged last one, in both layouts, for 4- and 2-byte elements, the bytes
// and the hash are those of the payload itself; byte planes are what the format says (plane j of a
// block: byte j of each element). A frame cut short, one with bytes after it, one that holds more
// or fewer bytes than the tensor, and bytes that are no frame are errors that say so (a frame
// corrupted inside is the checksum's to catch: Corruption.FlippedByteInCompressedFrame).
// The difference payload as the format defines it, computed element by element in signed
// arithmetic: d = now - base in E-byte two's complement, then 2d, or -2d - 1 when d < 0.
std::vector<uint8_t> zigzag_payload(const std::vector<uint8_t>& now,
                                    const std::vector<uint8_t>& base, int elem) {
  std::vector<uint8_t> out(now.size());
  const int bits = 8 * elem;
  for (size_t i = 0; i + elem <= now.size(); i += elem) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, &now[i], elem);
    std::memcpy(&b, &base[i], elem);
    const __int128 span = static_cast<__int128>(1) << bits;
    __int128 d = (static_cast<__int128>(a) - static_cast<__int128>(b)) % span;
    if (d < 0) d += span;
    if (d >= span / 2) d -= span;  // the signed value
    const __int128 z = d >= 0 ? 2 * d : -2 * d - 1;
    const uint64_t zz = static_cast<uint64_t>(z);
    std::memcpy(&out[i], &zz, elem);
  }
  return out;
}

// The writer's encoder (a block at a time: the payload against the base, byte planes, one zstd
// frame that declares its size) gives the frame whose content is the format's payload: the bytes,
// their xor with the base or their difference from it, in byte planes for that layout; over several
// blocks and a ragged last one, for 2-, 4- and 8-byte elements, and for an empty tensor.
TEST(DiskDelta, BlockwiseEncoderGivesTheFormatsPayload) {
  namespace dd = disk_delta;
  const size_t n = 2 * dd::kPlaneBlock + 12344;
  std::vector<uint8_t> plain(n), base(n);
  std::mt19937 g(9);
  for (size_t i = 0; i < n; ++i) {
    plain[i] = static_cast<uint8_t>(i % 5 == 0 ? g() : i % 3);
    base[i] = static_cast<uint8_t>(i % 11 == 0 ? g() : i % 3);
  }
  using E = dd::TensorEncoding;
  for (const dd::TensorLayout layout : {dd::TensorLayout::kBytes, dd::TensorLayout::kBytePlanes})
    for (const int elem : {4, 2, 8})
      for (const E enc : {E::kFull, E::kXor, E::kDifference}) {
        if (enc == E::kDifference && layout != dd::TensorLayout::kBytePlanes) continue;
        const bool with_base = dd::applies_to_base(enc);
        std::vector<uint8_t> bytes = plain;
        if (enc == E::kXor)
          for (size_t i = 0; i < n; ++i) bytes[i] ^= base[i];
        if (enc == E::kDifference) bytes = zigzag_payload(plain, base, elem);
        std::vector<uint8_t> want;
        if (layout == dd::TensorLayout::kBytePlanes) {
          dd::append_byte_planes(bytes, elem, want);
        } else {
          want = bytes;
        }
        std::vector<uint8_t> frame = {7, 7};  // appended after what is there
        auto size = dd::zstd_encode_append(plain, with_base ? base.data() : nullptr, enc, layout,
                                           elem, 1, frame);
        ASSERT_TRUE(size.ok()) << size.message();
        ASSERT_EQ(*size, frame.size() - 2);
        // Compressed (this byte pattern's element differences are not: they are no update of
        // numbers).
        if (enc != E::kDifference) {
          EXPECT_LT(*size, n / 2);
        }
        const std::span<const uint8_t> f(frame.data() + 2, *size);
        ASSERT_EQ(ZSTD_getFrameContentSize(f.data(), f.size()), n);
        std::vector<uint8_t> got(n);
        ASSERT_EQ(ZSTD_decompress(got.data(), n, f.data(), f.size()), n);
        EXPECT_TRUE(got == want) << dd::layout_name(layout) << " elem " << elem << " "
                                 << dd::encoding_name(enc);
      }
  std::vector<uint8_t> empty_frame;
  auto e =
      dd::zstd_encode_append({}, nullptr, E::kFull, dd::TensorLayout::kBytes, 4, 1, empty_frame);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(ZSTD_getFrameContentSize(empty_frame.data(), empty_frame.size()), 0u);
}

// A kSmall frame stores runs of one byte value as matches and every other byte as a literal
// (disk_delta_format.cc, runs_as_matches): on float weights' byte planes it is smaller than zstd's
// own level-1 parse of the same planes, an update's long zero runs stay a few bytes, and zstd
// decodes it to the planes.
TEST(DiskDelta, SmallFramesAreHuffmanLiteralsAndRunsSmallerThanZstdsOwnParse) {
  namespace dd = disk_delta;
  using E = dd::TensorEncoding;
  std::mt19937 rng(21);
  const NamedTensor w = random_tensor(rng, "w", {1024, 1024});  // 4 MiB of N(0, 0.02)
  NamedTensor next = w;  // an update: one value in 64 (at random) a few units in its last place
  for (size_t i = 0; i < next.bytes.size(); i += 4)
    if (rng() % 64 == 0) next.bytes[i] += static_cast<uint8_t>(1 + rng() % 4);
  const size_t n = w.bytes.size();
  for (const bool update : {false, true}) {
    const std::vector<uint8_t>& bytes = update ? next.bytes : w.bytes;
    const E enc = update ? E::kDifference : E::kFull;
    std::vector<uint8_t> planes;
    dd::append_byte_planes(update ? zigzag_payload(next.bytes, w.bytes, 4) : w.bytes, 4, planes);
    std::vector<uint8_t> frame;
    auto size = dd::zstd_encode_append(bytes, update ? w.bytes.data() : nullptr, enc,
                                       dd::TensorLayout::kBytePlanes, 4, 1, frame);
    ASSERT_TRUE(size.ok()) << size.message();
    std::vector<uint8_t> zstds(ZSTD_compressBound(n));
    const size_t zstds_size = ZSTD_compress(zstds.data(), zstds.size(), planes.data(), n, 1);
    ASSERT_FALSE(ZSTD_isError(zstds_size));
    std::printf("[%s] 4 MiB in byte planes: kSmall %zu bytes, zstd -1 %zu\n",
                update ? "update, difference" : "weights, full", *size, zstds_size);
    EXPECT_LT(*size, zstds_size);
    // One value in 64 changed: three planes all zeros, one mostly zeros.
    if (update) {
      EXPECT_LT(*size, n / 30);
    }
    std::vector<uint8_t> got(n);
    ASSERT_EQ(ZSTD_decompress(got.data(), n, frame.data(), frame.size()), n);
    EXPECT_TRUE(got == planes);
  }
}

TEST(DiskDelta, PieceDecodeEqualsThePayloadInEveryLayoutAndRefusesBadFrames) {
  namespace dd = disk_delta;
  const size_t n = 2 * dd::kDecodePiece + 12344;  // a multiple of 4 and 2; a ragged last piece
  std::vector<uint8_t> plain(n), base(n);
  std::mt19937 g(5);
  for (size_t i = 0; i < n; ++i) {
    plain[i] = static_cast<uint8_t>(i % 7 == 0 ? g() : i % 4);  // compressible, not trivially
    base[i] = static_cast<uint8_t>(g());
  }
  std::vector<uint8_t> want_xor = base;
  for (size_t i = 0; i < n; ++i) want_xor[i] ^= plain[i];
  using E = dd::TensorEncoding;
  {  // the layout itself, on a block of 5 four-byte elements
    const std::vector<uint8_t> e = {0,  1,  2,  3,  10, 11, 12, 13, 20, 21,
                                    22, 23, 30, 31, 32, 33, 40, 41, 42, 43};
    std::vector<uint8_t> planes;
    dd::append_byte_planes(e, 4, planes);
    EXPECT_EQ(planes, (std::vector<uint8_t>{0, 10, 20, 30, 40, 1, 11, 21, 31, 41,
                                            2, 12, 22, 32, 42, 3, 13, 23, 33, 43}));
  }
  for (const dd::TensorLayout layout : {dd::TensorLayout::kBytes, dd::TensorLayout::kBytePlanes})
    for (const int elem : {4, 2, 8})
      for (const E enc : {E::kFull, E::kXor, E::kDifference}) {
        if (enc == E::kDifference && layout != dd::TensorLayout::kBytePlanes) continue;
        // The payload whose application to `base` (or to anything, for full) gives `plain`; for
        // xor, applying plain gives want_xor.
        const std::vector<uint8_t> bytes =
            enc == E::kDifference ? zigzag_payload(plain, base, elem) : plain;
        std::vector<uint8_t> payload;
        if (layout == dd::TensorLayout::kBytePlanes)
          dd::append_byte_planes(bytes, elem, payload);
        else
          payload = bytes;
        std::vector<uint8_t> frame;
        ASSERT_TRUE(dd::zstd_encode_append(payload, nullptr, E::kFull, dd::TensorLayout::kBytes, 1,
                                           1, frame)
                        .ok());
        for (const size_t chunk : {frame.size(), size_t{777}}) {  // whole, or as a file gives it
          std::vector<uint8_t> out =
              dd::applies_to_base(enc) ? base : std::vector<uint8_t>(n, 0xAA);
          size_t given = 0;
          const dd::FrameChunks chunks = [&]() -> Result<std::span<const uint8_t>> {
            const size_t c = std::min(chunk, frame.size() - given);
            given += c;
            return std::span<const uint8_t>(frame).subspan(given - c, c);
          };
          weight_sync_detail::Xxh3Stream hash;
          int pieces = 0;
          ASSERT_TRUE(dd::zstd_decode_pieces(chunks, out, enc, layout, elem,
                                             [&](std::span<const uint8_t> p) {
                                               hash.update(p.data(), p.size());
                                               ++pieces;
                                             })
                          .ok());
          EXPECT_EQ(pieces, 3);
          EXPECT_TRUE(out == (enc == E::kXor ? want_xor : plain))
              << dd::layout_name(layout) << " elem " << elem << " " << dd::encoding_name(enc)
              << " chunk " << chunk;
          EXPECT_EQ(hash.hex(), dd::xxh3_128_hex(out));
        }
      }
  std::vector<uint8_t> frame;
  ASSERT_TRUE(
      dd::zstd_encode_append(plain, nullptr, E::kFull, dd::TensorLayout::kBytes, 1, 1, frame).ok());
  const auto whole_frame = [](std::span<const uint8_t> f) -> dd::FrameChunks {
    return [f, given = false]() mutable -> Result<std::span<const uint8_t>> {
      if (given) return std::span<const uint8_t>();
      given = true;
      return f;
    };
  };
  const auto fails = [&](std::span<const uint8_t> f, size_t size, const std::string& want) {
    for (const dd::TensorLayout layout :
         {dd::TensorLayout::kBytes, dd::TensorLayout::kBytePlanes}) {
      std::vector<uint8_t> out(size);
      const Status s = dd::zstd_decode_pieces(whole_frame(f), out, E::kFull, layout, 2,
                                              [](std::span<const uint8_t>) {});
      ASSERT_FALSE(s.ok()) << want;
      EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
    }
  };
  fails(std::span(frame).first(frame.size() / 2), n, "ends early");
  std::vector<uint8_t> trailing = frame;
  trailing.push_back(0);
  fails(trailing, n, "follow the zstd frame");
  fails(frame, n - 2, "expected");
  fails(frame, n + 2, "expected");
  fails(std::span(frame).subspan(1), n, "not a zstd frame");
  // A frame that declares a window far larger than the tensor (no content size, window 2^24) is
  // refused, not given a 16 MiB window.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, 24);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  const std::vector<uint8_t> small(4096, 7);
  std::vector<uint8_t> wide(ZSTD_compressBound(small.size()) + 64);
  ZSTD_outBuffer ob{wide.data(), wide.size(), 0};
  ZSTD_inBuffer head{small.data(), 2048, 0}, tail{small.data() + 2048, 2048, 0};
  ZSTD_compressStream2(cctx, &ob, &head, ZSTD_e_continue);  // streamed: the size is not known
  ASSERT_EQ(ZSTD_compressStream2(cctx, &ob, &tail, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(cctx);
  wide.resize(ob.pos);
  ASSERT_EQ(ZSTD_getFrameContentSize(wide.data(), wide.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  fails(wide, small.size(), "corrupt zstd frame");
}

// ---- a writer process killed in the middle of a publish ---------------------------------------

TEST(DiskDelta, WriterKilledBeforeRenameNeverShows) {
  TempDir tmp;
  std::mt19937 rng(5);
  WeightSet w = synthetic_set(rng, 8, 64);
  {
    DiskDeltaWriter writer(tmp.path());
    ASSERT_TRUE(writer.publish(1, w).ok());
  }
  const WeightSet v1 = w;
  perturb(w, rng, 8, 0.5);
  int pipe_fd[2];
  ASSERT_EQ(::pipe(pipe_fd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the writer: files written and fsynced, then it stops before the rename
    ::close(pipe_fd[0]);
    DiskDeltaOptions o;
    o.before_rename = [&](const std::string& tmp_dir) {
      const char ok = 1;
      (void)!::write(pipe_fd[1], &ok, 1);
      for (;;) ::pause();
    };
    DiskDeltaWriter writer(tmp.path(), o);
    (void)writer.publish(2, w);
    ::_exit(3);
  }
  ::close(pipe_fd[1]);
  char c = 0;
  ASSERT_EQ(::read(pipe_fd[0], &c, 1), 1);
  ::close(pipe_fd[0]);
  DiskDeltaReader reader(tmp.path());
  EXPECT_EQ(*reader.latest_version(), 1);  // paused before the rename: not visible
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(tmp.path()))
    leftovers += e.path().filename().string().starts_with("weight_v000002.tmp-");
  EXPECT_EQ(leftovers, 1);  // its complete files are there, under the temporary name
  EXPECT_EQ(*reader.versions(), (std::vector<int64_t>{1}));
  auto l = reader.load(1);
  ASSERT_TRUE(l.ok()) << l.message();
  expect_same(*l, v1, "version 1 after the writer died");
  // A new writer publishes version 2 beside the leftover.
  DiskDeltaWriter writer(tmp.path());
  ASSERT_TRUE(writer.publish(2, w).ok());
  auto l2 = reader.load(2);
  ASSERT_TRUE(l2.ok()) << l2.message();
  expect_same(*l2, w, "version 2");
}

// ---- bandwidth on 64 MB ----------------------------------------------------------------------

TEST(DiskDelta, PublishBandwidth64MB) {
  TempDir tmp;
  std::mt19937 rng(9);
  WeightSet w = synthetic_set(rng, 16, 4096);  // 16 x 4 MiB
  const double mb = 64.0;
  auto raw_write = [&] {  // baseline: the same bytes written raw and fsynced, one file
    std::vector<uint8_t> all;
    for (const auto& t : w) all.insert(all.end(), t.bytes.begin(), t.bytes.end());
    const auto t0 = std::chrono::steady_clock::now();
    MILES_CHECK(disk_delta::write_file_synced(tmp.sub("raw.bin"), all).ok(), "raw write");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fs::remove(tmp.sub("raw.bin"));
    return s;
  };
  const double raw_s = raw_write();
  std::printf("baseline: raw write + fsync of 64 MiB: %.3f s, %.0f MB/s\n", raw_s, mb / raw_s);
  DiskDeltaOptions options;
  options.full_every = 100;
  DiskDeltaWriter writer(tmp.path(), options);
  DiskDeltaReader reader(tmp.path());
  auto report = [&](const char* what, const PublishStats& st) {
    std::printf(
        "%-36s %.3f s, %9lld bytes written (%.3f of raw), %6.0f MB/s of weights, %.2fx the raw "
        "write\n",
        what, st.seconds, (long long)st.bytes_written, st.bytes_written / (mb * 1048576),
        mb / st.seconds, st.seconds / raw_s);
  };
  auto full = writer.publish(1, w);
  ASSERT_TRUE(full.ok()) << full.message();
  report("full (zstd 1):", *full);
  perturb(w, rng, 4, 0.01);
  auto sparse = writer.publish(2, w);
  ASSERT_TRUE(sparse.ok());
  report("delta, 4 tensors x 1% values (xor):", *sparse);
  perturb(w, rng, 64, 1.0);  // every value of (almost) every tensor moves: a dense AdamW step
  auto dense = writer.publish(3, w);
  ASSERT_TRUE(dense.ok());
  report("delta, dense step (xor):", *dense);
  WeightSet engine = std::move(*reader.load(1));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(reader.advance(engine, 1, 3).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("reader: apply 2 deltas + verify: %.3f s, %.0f MB/s of weights per version\n", s,
              2 * mb / s);
  expect_same(engine, w, "engine after the bandwidth run");
}

}  // namespace
}  // namespace miles
