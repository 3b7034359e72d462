// The on-disk format of the disk-delta transport: version directory names, the manifest, the data
// file of zstd frames, checksums, and synced file IO.
//
// Why: the writer and the reader must agree on every byte; keeping the format in one place (and the
// parsing strict, with errors that name the file and field) lets each side stay a short sequence of
// named phases.
//
// Layout of DIR:
//   weight_v000001/manifest.json   the manifest (below)
//   weight_v000001/tensors.zst     zstd frames, one per stored tensor, at the manifest's offsets
//   weight_v000002/...             a delta against weight_v000001
//   weight_v000003.tmp-<pid>-<n>/  a publish in progress or killed: never read
//   LATEST                         "3\n" (informative; readers list directories)
// manifest.json:
//   {"format": "miles-disk-delta", "format_version": 1, "version": 2, "base_version": 1 | null,
//    "data_file": "tensors.zst", "data_bytes": N, "checksum": "xxh3-128",
//    "tensors": [{"name", "dtype", "shape", "encoding": "full"|"xor"|"overwrite"|"unchanged",
//                 "nbytes", "offset", "compressed_bytes", "xxh3_128": 32 hex digits}]}
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles::disk_delta {

inline constexpr const char* kFormat = "miles-disk-delta";
inline constexpr int kFormatVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kDataFile = "tensors.zst";
inline constexpr const char* kLatestFile = "LATEST";

enum class TensorEncoding { kFull, kXor, kOverwrite, kUnchanged };
std::string_view encoding_name(TensorEncoding e);
std::optional<TensorEncoding> encoding_from_name(std::string_view name);

struct ManifestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  TensorEncoding encoding = TensorEncoding::kFull;
  uint64_t nbytes = 0;            // decoded (final) size
  uint64_t offset = 0;            // of its zstd frame in the data file (0 when unchanged)
  uint64_t compressed_bytes = 0;  // size of the frame (0 when unchanged)
  std::string xxh3_128;           // of the FINAL bytes, 32 lowercase hex digits (canonical order)
};

struct Manifest {
  int64_t version = 0;
  std::optional<int64_t> base_version;  // none: a full version
  uint64_t data_bytes = 0;              // size of the data file
  std::vector<ManifestTensor> tensors;
  bool is_full() const { return !base_version.has_value(); }
};

std::string manifest_to_json(const Manifest& m);
// Strict: every field present and typed, sizes consistent; errors name `source` and the field.
Result<Manifest> manifest_from_json(const std::string& text, const std::string& source);

// "weight_v000005"; versions beyond six digits get more.
std::string version_dir_name(int64_t version);
// The version of a published directory name; nullopt for anything else (".tmp-*", LATEST, ...).
std::optional<int64_t> parse_version_dir_name(std::string_view name);
// Published versions in `dir`, ascending.
Result<std::vector<int64_t>> list_versions(const std::string& dir);

// xxh3-128 of `bytes` as 32 hex digits, high half first (xxhsum -H2's canonical form).
std::string xxh3_128_hex(std::span<const uint8_t> bytes);
// Bytes per element of a safetensors dtype spelling; 0 when unknown (then sizes are not checked).
int dtype_bytes(std::string_view dtype);
// Elements of `shape`; nullopt when a dimension is negative or the product overflows 64 bits.
std::optional<uint64_t> numel_of(const std::vector<int64_t>& shape);
// numel_of(shape) * dtype_bytes(dtype); nullopt when that overflows. note: a known dtype only.
std::optional<uint64_t> nbytes_of(std::string_view dtype, const std::vector<int64_t>& shape);
// The most bytes one byte of a zstd frame decodes to: an RLE block is a 3-byte header and one
// byte that stands for up to 128 KiB. A manifest whose nbytes exceed compressed_bytes times this
// is refused before anything is allocated for it.
inline constexpr uint64_t kMaxZstdRatio = (uint64_t{128} << 10) / 4;

// One zstd frame of `in` at `level`, appended to `out`; returns the frame's size.
Result<size_t> zstd_compress_append(std::span<const uint8_t> in, int level, std::vector<uint8_t>& out);
// Checks the frame's header: a zstd frame that does not declare another size than `size` (the
// reader checks before it allocates the output). Errors as zstd_decompress_exact's.
Status zstd_check_frame_size(std::span<const uint8_t> frame, uint64_t size);
// Decodes one frame into exactly out.size() bytes; errors (corrupt frame, wrong size) carry zstd's
// message, the caller adds the file and tensor.
Status zstd_decompress_exact(std::span<const uint8_t> frame, std::span<uint8_t> out);

// Writes `bytes` to `path` (created, truncated) and fsyncs it.
Status write_file_synced(const std::string& path, std::span<const uint8_t> bytes);
Status fsync_dir(const std::string& dir);
Result<std::vector<uint8_t>> read_file(const std::string& path);

}  // namespace miles::disk_delta
