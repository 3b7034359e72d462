// libFuzzer target: arbitrary bytes as disk-delta version directories (disk_delta_framing.h: one
// or two versions, manifest.json + tensors.zst each), written to a scratch directory of this
// process, then read as an engine does: the newest version loaded from scratch (DiskDeltaReader::
// load), and version 1 advanced to 2. A hostile manifest (sizes that overflow, offsets past the
// data, a frame that claims more bytes than it holds) must come back as an error value: no crash,
// no UB, no leak, no allocation beyond what the files justify.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "disk_delta_framing.h"
#include "miles/weight_sync/disk_delta.h"

namespace {
namespace fs = std::filesystem;

// /dev/shm (or the temp directory)/miles_fuzz_disk_delta_<pid>, removed at exit.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::error_code ec;
    const fs::path base =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    path = base / ("miles_fuzz_disk_delta_" + std::to_string(::getpid()));
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir scratch;
  const auto versions =
      miles::fuzz::unframe(std::string_view(reinterpret_cast<const char*>(data), size));
  std::error_code ec;
  fs::remove_all(scratch.path, ec);  // the last input's versions
  for (size_t i = 0; i < versions.size(); ++i) {
    const fs::path dir = scratch.path / ("weight_v00000" + std::to_string(i + 1));
    fs::create_directories(dir, ec);
    write(dir / "manifest.json", versions[i].manifest);
    write(dir / "tensors.zst", versions[i].data);
  }
  const miles::DiskDeltaReader reader(scratch.path.string());
  auto latest = reader.latest_version();
  if (!latest.ok()) return 0;
  (void)reader.latest_full_version();
  (void)reader.load(*latest);
  if (auto first = reader.load(1); first.ok() && *latest == 2) {
    miles::WeightSet w = std::move(first).value();
    (void)reader.advance(w, 1, 2);
  }
  return 0;
}
