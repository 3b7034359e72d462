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
//   {"format": "miles-disk-delta", "format_version": 3, "version": 2, "base_version": 1 | null,
//    "data_file": "tensors.zst", "data_bytes": N, "checksum": "xxh3-128",
//    "tensors": [{"name", "dtype", "shape",
//                 "encoding": "full"|"difference"|"xor"|"overwrite"|"unchanged",
//                 "layout": "bytes"|"byte_planes",
//                 "nbytes", "offset", "compressed_bytes", "xxh3_128": 32 hex digits}]}
// A frame decodes to the payload in its layout. The payload: the tensor's bytes (full, overwrite);
// their xor with the base's (xor); or (difference, byte_planes only) each element's bits minus the
// base element's, as unsigned integers of the dtype's size E (wrapping), zigzag-coded: d -> 2d for
// d >= 0, -2d - 1 for d < 0. An update moves a float weight by a few units in its last place, so
// its difference is a small integer whose high bytes are zero, where the xor's carry chains set
// bits in a tenth of them after a first Adam step: there SmolLM2's difference compresses to 0.79x
// the xor and its sparse planes decode several times faster; later steps move most weights by
// less, and the two come within 1-6 % (docs/benchmarks.md, "Weight sync"). Layouts:
// "bytes" as they are; "byte_planes" cut in blocks of kPlaneBlock bytes (the last one shorter),
// each block of m elements of E bytes (E = the dtype's size, 2 or more) stored as E planes of m
// bytes: byte 0 of every element, then byte 1, ... Float weights' sign/exponent bytes and their
// low mantissa bytes then sit apart: zstd codes the first with few bits and stores the second
// nearly raw, which decodes about twice as fast as the interleaved bytes (and compresses better).
// Format version 1 (no "layout": every tensor "bytes") and 2 (no "difference") are still read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles::disk_delta {

inline constexpr const char* kFormat = "miles-disk-delta";
inline constexpr int kFormatVersion = 3;
inline constexpr int kOldestReadableFormatVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kDataFile = "tensors.zst";
inline constexpr const char* kLatestFile = "LATEST";

enum class TensorEncoding { kFull, kDifference, kXor, kOverwrite, kUnchanged };
std::string_view encoding_name(TensorEncoding e);
std::optional<TensorEncoding> encoding_from_name(std::string_view name);
// The encodings whose payload is applied to the base's bytes (difference, xor).
inline bool applies_to_base(TensorEncoding e) {
  return e == TensorEncoding::kDifference || e == TensorEncoding::kXor;
}

enum class TensorLayout { kBytes, kBytePlanes };
std::string_view layout_name(TensorLayout l);
inline constexpr size_t kPlaneBlock = size_t{1} << 20;  // a multiple of every dtype's size
// What the writer stores a dtype as: byte planes for elements of 2 bytes or more.
TensorLayout layout_for(std::string_view dtype);
// `in` (elements of `elem` bytes) in the byte_planes layout, appended to `out`.
void append_byte_planes(std::span<const uint8_t> in, int elem, std::vector<uint8_t>& out);
// One block of the byte_planes layout (len bytes at `planes`) back to elements at `out`, as
// `encoding` says: written over it (full, overwrite), xor'ed into it (xor), or added to it
// (difference: out += unzigzag(element), per element of `elem` bytes, wrapping).
void from_byte_planes(const uint8_t* planes, size_t len, int elem, uint8_t* out,
                      TensorEncoding encoding);

struct ManifestTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  TensorEncoding encoding = TensorEncoding::kFull;
  TensorLayout layout = TensorLayout::kBytes;
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

// A tensor's frame, encoded piece by piece (a kPlaneBlock block at a time: the payload of
// `encoding` against the same bytes of `base`, which difference and xor need, then in byte planes
// for layout byte_planes with elements of `elem` bytes) and compressed as one zstd frame at `level`
// that declares its size, appended to `out`; returns the frame's size. Nothing of the tensor's size
// is held beside the frame. difference needs byte_planes and elem 2, 4 or 8. Without raw_literals
// (DeltaCompression::kSmall) only runs of one byte value are matches and every other byte is a
// Huffman-coded literal; with it (kFast), zstd's own matches and the literals stored as they are.
// Any zstd decoder reads both.
Result<size_t> zstd_encode_append(std::span<const uint8_t> bytes, const uint8_t* base,
                                  TensorEncoding encoding, TensorLayout layout, int elem, int level,
                                  std::vector<uint8_t>& out, bool raw_literals = false);
// Checks the frame's header: a zstd frame that does not declare another size than `size` (the
// reader checks before it allocates the output).
Status zstd_check_frame_size(std::span<const uint8_t> frame, uint64_t size);

// Decodes one frame of `layout` into exactly out.size() bytes, piece by piece (kDecodePiece
// bytes, one byte_planes block), applied to `out` as `encoding` says (from_byte_planes), through a
// piece buffer of the thread's where a piece needs one (so a delta needs no buffer of its size);
// `piece_done` gets each finished piece of `out` while it is still in cache (the reader hashes it
// there). `elem`: the dtype's size (byte_planes). Errors (a corrupt frame with zstd's message, one
// that ends early, runs past out.size() or has bytes after it) leave the file and tensor to the
// caller.
inline constexpr size_t kDecodePiece = kPlaneBlock;
// A frame's bytes in order, a chunk per call (an empty one: no more), so that a frame read from a
// file needs no buffer of its size.
using FrameChunks = std::function<Result<std::span<const uint8_t>>()>;
Status zstd_decode_pieces(const FrameChunks& frame, std::span<uint8_t> out, TensorEncoding encoding,
                          TensorLayout layout, int elem,
                          const std::function<void(std::span<const uint8_t>)>& piece_done);

// A version's data file, opened once and read a chunk at a time (pread, any thread): neither the
// file nor a frame is ever held whole in memory.
class DataFile {
 public:
  static Result<DataFile> open(const std::string& path);
  DataFile(DataFile&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), size_(o.size_) {
    o.fd_ = -1;
  }
  DataFile& operator=(DataFile&&) = delete;
  ~DataFile();
  // Bytes [offset, offset + n) as FrameChunks of up to kReadChunk bytes, read as they are asked
  // for into a buffer of the calling thread (valid until its next chunk).
  static constexpr uint64_t kReadChunk = uint64_t{1} << 20;
  FrameChunks chunks(uint64_t offset, uint64_t n) const;
  uint64_t size() const { return size_; }

 private:
  DataFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {}
  int fd_;
  std::string path_;
  uint64_t size_ = 0;
};

// Writes `bytes` to `path` (created, truncated) and fsyncs it.
Status write_file_synced(const std::string& path, std::span<const uint8_t> bytes);
Status fsync_dir(const std::string& dir);
Result<std::vector<uint8_t>> read_file(const std::string& path);

}  // namespace miles::disk_delta
