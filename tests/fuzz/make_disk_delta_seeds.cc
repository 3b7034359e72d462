// Writes the seed corpus of fuzz_disk_delta (tests/fuzz/corpus/disk_delta): real version
// directories made by DiskDeltaWriter, framed as disk_delta_framing.h describes. From the
// repository root: build-fuzz/bin/make_disk_delta_seeds tests/fuzz/corpus/disk_delta
//
// Why a program: tensors.zst holds zstd frames, which the standard-library make_seeds.py cannot
// write; the writer itself makes seeds that stay in step with the format.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "disk_delta_framing.h"
#include "miles/weight_sync/disk_delta.h"

namespace {
namespace fs = std::filesystem;
using miles::DeltaEncoding;
using miles::NamedTensor;
using miles::WeightSet;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Small tensors: F32 [2, 3], BF16 [4], an empty I8 [0, 4], one of a dtype the transport does not
// know.
WeightSet weights(uint8_t salt) {
  WeightSet w = {{"model.embed.weight", "F32", {2, 3}, std::vector<uint8_t>(24)},
                 {"model.norm.weight", "BF16", {4}, std::vector<uint8_t>(8)},
                 {"model.empty", "I8", {0, 4}, {}},
                 {"model.scales", "Q4X", {3}, std::vector<uint8_t>(5)}};
  for (NamedTensor& t : w)
    for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  w[0].bytes[3] ^= salt;  // version 2 changes the first tensor only
  return w;
}

// Publishes versions 1 (full) and, with `second`, 2 into a fresh directory; returns the framed
// bytes.
std::string make(bool second, miles::DiskDeltaOptions options) {
  const fs::path dir = fs::temp_directory_path() / ("miles_dd_seeds_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  options.write_latest = false;
  miles::DiskDeltaWriter writer(dir.string(), options);
  std::vector<miles::fuzz::VersionFiles> versions;
  for (int64_t v = 1; v <= (second ? 2 : 1); ++v) {
    auto st = writer.publish(v, weights(v == 1 ? 0 : 0x5a));
    if (!st.ok()) {
      std::fprintf(stderr, "publish %lld: %s\n", static_cast<long long>(v), st.message().c_str());
      std::exit(1);
    }
    char name[32];
    std::snprintf(name, sizeof name, "weight_v%06lld", static_cast<long long>(v));
    versions.push_back({slurp(dir / name / "manifest.json"), slurp(dir / name / "tensors.zst")});
  }
  fs::remove_all(dir);
  return miles::fuzz::frame(versions);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  fs::create_directories(out);
  miles::DiskDeltaOptions difference_delta, xor_delta, overwrite_delta, all_full;
  difference_delta.encoding = DeltaEncoding::kDifference;
  xor_delta.encoding = DeltaEncoding::kXor;
  overwrite_delta.encoding = DeltaEncoding::kOverwrite;
  all_full.full_every = 1;
  const std::pair<const char*, std::string> seeds[] = {
      {"full", make(false, xor_delta)},     {"difference_delta", make(true, difference_delta)},
      {"xor_delta", make(true, xor_delta)}, {"overwrite_delta", make(true, overwrite_delta)},
      {"two_full", make(true, all_full)},
  };
  for (const auto& [name, bytes] : seeds) {
    std::ofstream(out / name, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::printf("%s: %zu bytes\n", (out / name).c_str(), bytes.size());
  }
  return 0;
}
