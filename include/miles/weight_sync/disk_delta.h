// Disk-delta weight transport: versioned weight sets on a shared filesystem, each update storing
// only what changed since the last published version.
//
// Why: engines that share no fabric with the trainer (another cluster, a laptop, a late joiner)
// still need every weight version, bit for bit. The trainer keeps a snapshot of the last published
// weights; each publish writes a directory `weight_v{N:06d}/` holding a manifest (version,
// base_version, per-tensor encoding, sizes and the xxh3-128 of each tensor's FINAL bytes) and one
// file of zstd frames, one per stored tensor. The directory appears atomically (temporary
// directory, fsync of files and directory, rename, fsync of the parent), so a reader never sees a
// half-written version. Every `full_every`-th publish is a full version from which a reader can
// join late; the others are deltas (`xor` against the base: apply exactly once to the right base;
// `overwrite`: idempotent). Readers apply the chain in order, verify every checksum after every
// step, and on any error leave the caller's weights untouched (design contracts §3, disk-delta).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/status.h"

namespace miles {

// One named tensor of raw bytes (row-major). dtype is the safetensors spelling ("F32", "BF16",
// ...); the transport never interprets the values, only checks bytes == numel * size for known
// dtypes.
struct NamedTensor {
  std::string name;            // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype = "F32";   // safetensors spelling
  std::vector<int64_t> shape;  // outermost first
  std::vector<uint8_t> bytes;  // [numel * dtype size]
};
// An ordered weight set; names are unique.
using WeightSet = std::vector<NamedTensor>;

// Copies of every tensor of `map`, in its (sorted) name order.
WeightSet weight_set_from_tensor_map(const TensorMap& map);
// Views of `set` (the map keeps a shared copy alive); errors name a tensor of unknown dtype.
Result<TensorMap> tensor_map_from_weight_set(WeightSet set);

// How a delta stores a changed tensor.
enum class DeltaEncoding {
  // Each element's bits minus the base's, as an integer (zigzag-coded): an update of a few units
  // in a float's last place is a small number with zero high bytes. Needs the exact base. In
  // SmolLM2's RL job the first delta is 0.79x the size of xor's and reads 1.4x faster, later ones
  // 0.94-0.99x at the same speed (docs/benchmarks.md). Tensors of 1-byte elements get xor.
  kDifference,
  kXor,        // new ^ base: zero bytes where values are unchanged; needs the exact base
  kOverwrite,  // the new bytes: idempotent, larger
};

// How the data files' zstd frames are made (both are plain zstd frames):
//   kSmall: only runs of one byte value (16 or more: an update's zero bytes, a constant tensor)
//   are matches, every other byte a Huffman-coded literal: the smallest files, and a load 15 %
//   faster than with zstd's own short matches, which cost more to decode than they save on
//   float bytes (docs/benchmarks.md, "Weight sync");
//   kFast: zstd's level-1 matches, the literals stored as they are: on SmolLM2's weights and an RL
//   step's difference delta the files are 1.4x (full) and 1.5x (delta) larger and decode faster,
//   for disks that read faster than the reader decodes.
// Readers read either; a directory may hold both.
enum class DeltaCompression { kSmall, kFast };

struct DiskDeltaOptions {
  int full_every = 10;  // publish k (0-based, per writer) is full when k % full_every == 0
  DeltaEncoding encoding = DeltaEncoding::kDifference;
  int zstd_level = 1;
  DeltaCompression compression = DeltaCompression::kSmall;
  bool write_latest = true;  // keep a LATEST file with the newest version (informative only)
  // Test hook: called with the temporary directory after every file is written and fsynced, just
  // before the rename that publishes it.
  std::function<void(const std::string& tmp_dir)> before_rename;
  // Optional: a tensor's xxh3-128 (hex) that the caller has already computed over exactly the bytes
  // being published (empty: the writer computes it). Saves a second pass over every weight; a wrong
  // value is caught by every reader's check.
  std::function<std::string(const std::string& name)> known_xxh3;
};

struct PublishStats {
  int64_t version = 0;
  std::optional<int64_t> base_version;  // none for a full version
  int64_t tensors = 0;
  int64_t tensors_stored = 0;  // full / xor / overwrite (not unchanged)
  int64_t raw_bytes = 0;       // bytes of the whole weight set
  int64_t bytes_written = 0;   // data file + manifest
  double seconds = 0;
};

// The trainer side. Not thread-safe; one writer per directory.
class DiskDeltaWriter {
 public:
  explicit DiskDeltaWriter(std::string dir, DiskDeltaOptions options = {});
  // Publishes `tensors` as `version`; the directory is created when missing. Versions must
  // increase beyond every version already in the directory. On error nothing is published and the
  // snapshot stays at the last published version.
  Result<PublishStats> publish(int64_t version, const WeightSet& tensors);
  std::optional<int64_t> last_published() const { return last_version_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  DiskDeltaOptions options_;
  WeightSet snapshot_;  // the last published weights
  std::optional<int64_t> last_version_;
  int64_t publishes_ = 0;
};

// Removes the versions of `dir` that no reader needs to load or reach `oldest_kept` or any newer
// version: every version older than the newest full version at or below `oldest_kept` (a chain to
// a newer version never passes below its newest full base, and a reader behind that base joins
// from a full version). Each goes by a rename to a `.tmp-` name (which readers never list) and
// then its removal, so no reader sees half of a version. Returns how many were removed (none
// when no full version is at or below `oldest_kept`).
Result<int64_t> prune_versions(const std::string& dir, int64_t oldest_kept);

// The engine side. Stateless: every call reads the directory.
class DiskDeltaReader {
 public:
  explicit DiskDeltaReader(std::string dir) : dir_(std::move(dir)) {}
  // Published versions, ascending (temporary `.tmp-*` directories are ignored).
  Result<std::vector<int64_t>> versions() const;
  // The newest version / the newest full version; an error when there is none.
  Result<int64_t> latest_version() const;
  Result<int64_t> latest_full_version() const;
  // The newest full version at or below `version`; nullopt when there is none.
  Result<std::optional<int64_t>> full_version_at_or_below(int64_t version) const;
  // The weights of `target` from scratch: its full base, then every delta in order. checksums:
  // when given, each tensor's xxh3-128 (hex) as verified against the target's manifest.
  Result<WeightSet> load(int64_t target, std::vector<std::string>* checksums = nullptr) const;
  // Moves `current` (the weights of `current_version`) to `target` by applying the chain of deltas
  // (or from a newer full version). Every tensor's checksum is verified after every step. On error
  // `current` is left untouched; the message names the version, file and tensor. Only the tensors
  // a version changes are copied (then swapped in): the others are read where they are.
  Status advance(WeightSet& current, int64_t current_version, int64_t target,
                 std::vector<std::string>* checksums = nullptr) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace miles
