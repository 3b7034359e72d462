// The disk-delta on-disk format: manifest JSON, directory names, checksums, zstd frames, synced IO.
#include "weight_sync/disk_delta_format.h"

#include <emmintrin.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_literalCompressionMode, ZSTD_registerSequenceProducer
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "miles/check.h"
#include "miles/durable_file.h"
#include "miles/json_text.h"
#include "weight_sync/xxh3.h"

namespace miles::disk_delta {
namespace {

bool is_hex32(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Typed field access; the error names the source and the field path.
template <typename T>
Result<T> field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    return Status::Error(where + ": missing field '" + key + "'");
  const auto& v = j.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return Status::Error(where + ": field '" + key + "' is not a string");
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!v.is_number_unsigned())
      return Status::Error(where + ": field '" + key + "' is not an unsigned integer");
  } else {
    if (!v.is_number_integer())
      return Status::Error(where + ": field '" + key + "' is not an integer");
  }
  return v.get<T>();
}

Result<ManifestTensor> tensor_from_json(const nlohmann::json& j, const std::string& where,
                                        int64_t format_version) {
  ManifestTensor t;
  MILES_ASSIGN_OR_RETURN(t.name, field<std::string>(j, "name", where));
  const std::string at = where + " tensor '" + t.name + "'";
  MILES_ASSIGN_OR_RETURN(t.dtype, field<std::string>(j, "dtype", at));
  if (!j.contains("shape") || !j["shape"].is_array())
    return Status::Error(at + ": 'shape' is not an array");
  for (const auto& d : j["shape"]) {
    if (!d.is_number_unsigned()) return Status::Error(at + ": 'shape' has a non-natural dimension");
    if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return Status::Error(at + ": 'shape' has a dimension of 2^63 or more");
    t.shape.push_back(d.get<int64_t>());
  }
  MILES_ASSIGN_OR_RETURN(std::string enc, field<std::string>(j, "encoding", at));
  const auto e = encoding_from_name(enc);
  if (!e) return Status::Error(at + ": unknown encoding '" + enc + "'");
  t.encoding = *e;
  if (format_version >= 2) {
    MILES_ASSIGN_OR_RETURN(std::string layout, field<std::string>(j, "layout", at));
    if (layout == layout_name(TensorLayout::kBytePlanes)) {
      t.layout = TensorLayout::kBytePlanes;
      if (dtype_bytes(t.dtype) < 2)
        return Status::Error(at + ": layout 'byte_planes' needs a dtype of 2 bytes or more, not '" +
                             t.dtype + "'");
    } else if (layout != layout_name(TensorLayout::kBytes)) {
      return Status::Error(at + ": unknown layout '" + layout + "'");
    }
  } else if (j.contains("layout")) {
    return Status::Error(at + ": 'layout' in a format version 1 manifest");
  }
  if (t.encoding == TensorEncoding::kDifference) {
    if (format_version < 3)
      return Status::Error(at + ": encoding 'difference' in a format version " +
                           std::to_string(format_version) + " manifest");
    if (t.layout != TensorLayout::kBytePlanes)  // byte_planes: a dtype of 2, 4 or 8 bytes
      return Status::Error(at + ": encoding 'difference' needs layout 'byte_planes'");
  }
  MILES_ASSIGN_OR_RETURN(t.nbytes, field<uint64_t>(j, "nbytes", at));
  MILES_ASSIGN_OR_RETURN(t.offset, field<uint64_t>(j, "offset", at));
  MILES_ASSIGN_OR_RETURN(t.compressed_bytes, field<uint64_t>(j, "compressed_bytes", at));
  MILES_ASSIGN_OR_RETURN(t.xxh3_128, field<std::string>(j, "xxh3_128", at));
  if (!is_hex32(t.xxh3_128))
    return Status::Error(at + ": 'xxh3_128' is not 32 lowercase hex digits");
  if (dtype_bytes(t.dtype) > 0) {
    const std::optional<uint64_t> want = nbytes_of(t.dtype, t.shape);
    if (!want) return Status::Error(at + ": its dtype and shape need more than 2^64 bytes");
    if (*want != t.nbytes)
      return Status::Error(at + ": nbytes " + std::to_string(t.nbytes) +
                           " does not match dtype and shape");
  }
  if ((t.encoding == TensorEncoding::kUnchanged) != (t.compressed_bytes == 0))
    return Status::Error(at + ": compressed_bytes must be 0 exactly when unchanged");
  // A reader allocates nbytes for a stored tensor: no more than its frame can decode to.
  const uint64_t max_decoded = t.compressed_bytes > UINT64_MAX / kMaxZstdRatio
                                   ? UINT64_MAX
                                   : t.compressed_bytes * kMaxZstdRatio;
  if (t.encoding != TensorEncoding::kUnchanged && t.nbytes > max_decoded)
    return Status::Error(at + ": nbytes " + std::to_string(t.nbytes) +
                         " is more than a zstd frame of " + std::to_string(t.compressed_bytes) +
                         " bytes can hold");
  return t;
}

}  // namespace

std::string_view encoding_name(TensorEncoding e) {
  switch (e) {
    case TensorEncoding::kFull:
      return "full";
    case TensorEncoding::kDifference:
      return "difference";
    case TensorEncoding::kXor:
      return "xor";
    case TensorEncoding::kOverwrite:
      return "overwrite";
    case TensorEncoding::kUnchanged:
      return "unchanged";
  }
  return "?";
}

std::string_view layout_name(TensorLayout l) {
  return l == TensorLayout::kBytePlanes ? "byte_planes" : "bytes";
}

TensorLayout layout_for(std::string_view dtype) {
  return dtype_bytes(dtype) >= 2 ? TensorLayout::kBytePlanes : TensorLayout::kBytes;
}

std::optional<TensorEncoding> encoding_from_name(std::string_view name) {
  for (auto e : {TensorEncoding::kFull, TensorEncoding::kDifference, TensorEncoding::kXor,
                 TensorEncoding::kOverwrite, TensorEncoding::kUnchanged})
    if (encoding_name(e) == name) return e;
  return std::nullopt;
}

std::string manifest_to_json(const Manifest& m) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["version"] = m.version;
  j["base_version"] = m.base_version ? nlohmann::json(*m.base_version) : nlohmann::json(nullptr);
  j["data_file"] = kDataFile;
  j["data_bytes"] = m.data_bytes;
  j["checksum"] = "xxh3-128";
  nlohmann::json ts = nlohmann::json::array();
  for (const ManifestTensor& t : m.tensors) {
    ts.push_back({{"name", t.name},
                  {"dtype", t.dtype},
                  {"shape", t.shape},
                  {"encoding", std::string(encoding_name(t.encoding))},
                  {"layout", std::string(layout_name(t.layout))},
                  {"nbytes", t.nbytes},
                  {"offset", t.offset},
                  {"compressed_bytes", t.compressed_bytes},
                  {"xxh3_128", t.xxh3_128}});
  }
  j["tensors"] = std::move(ts);
  return j.dump(1) + "\n";
}

Result<Manifest> manifest_from_json(const std::string& text, const std::string& source) {
  nlohmann::json j = parse_json_or_discarded(text);
  if (j.is_discarded() || !j.is_object()) return Status::Error(source + ": not a JSON object");
  MILES_ASSIGN_OR_RETURN(std::string format, field<std::string>(j, "format", source));
  MILES_ASSIGN_OR_RETURN(int64_t fv, field<int64_t>(j, "format_version", source));
  if (format != kFormat || fv < kOldestReadableFormatVersion || fv > kFormatVersion)
    return Status::Error(source + ": format '" + format + "' version " + std::to_string(fv) +
                         " is not " + kFormat + " version " +
                         std::to_string(kOldestReadableFormatVersion) + " to " +
                         std::to_string(kFormatVersion));
  Manifest m;
  MILES_ASSIGN_OR_RETURN(m.version, field<int64_t>(j, "version", source));
  if (!j.contains("base_version")) return Status::Error(source + ": missing field 'base_version'");
  if (!j["base_version"].is_null()) {
    MILES_ASSIGN_OR_RETURN(int64_t b, field<int64_t>(j, "base_version", source));
    if (b >= m.version) return Status::Error(source + ": base_version is not older than version");
    m.base_version = b;
  }
  MILES_ASSIGN_OR_RETURN(std::string data_file, field<std::string>(j, "data_file", source));
  if (data_file != kDataFile)
    return Status::Error(source + ": unexpected data_file '" + data_file + "'");
  MILES_ASSIGN_OR_RETURN(m.data_bytes, field<uint64_t>(j, "data_bytes", source));
  MILES_ASSIGN_OR_RETURN(std::string checksum, field<std::string>(j, "checksum", source));
  if (checksum != "xxh3-128")
    return Status::Error(source + ": unknown checksum '" + checksum + "'");
  if (!j.contains("tensors") || !j["tensors"].is_array())
    return Status::Error(source + ": 'tensors' is not an array");
  uint64_t end = 0;
  std::set<std::string> names;  // a weight set names each tensor once
  for (const auto& tj : j["tensors"]) {
    MILES_ASSIGN_OR_RETURN(ManifestTensor t, tensor_from_json(tj, source, fv));
    if (!names.insert(t.name).second)
      return Status::Error(source + ": tensor '" + t.name + "' appears twice");
    if (m.is_full() && t.encoding != TensorEncoding::kFull)
      return Status::Error(source + ": tensor '" + t.name + "' of a full version is not 'full'");
    if (!m.is_full() && t.encoding == TensorEncoding::kFull)
      return Status::Error(source + ": tensor '" + t.name + "' of a delta is 'full'");
    if (t.compressed_bytes > 0) {
      if (t.offset != end)
        return Status::Error(source + ": tensor '" + t.name + "' offset is not contiguous");
      if (__builtin_add_overflow(end, t.compressed_bytes, &end) || end > m.data_bytes)
        return Status::Error(source + ": tensor '" + t.name + "' frame (offset " +
                             std::to_string(t.offset) + ", " + std::to_string(t.compressed_bytes) +
                             " bytes) ends past data_bytes " + std::to_string(m.data_bytes));
    }
    m.tensors.push_back(std::move(t));
  }
  if (end != m.data_bytes) return Status::Error(source + ": frames do not add up to data_bytes");
  return m;
}

std::string version_dir_name(int64_t version) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "weight_v%06lld", static_cast<long long>(version));
  return buf;
}

std::optional<int64_t> parse_version_dir_name(std::string_view name) {
  constexpr std::string_view kPrefix = "weight_v";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.size() < 6 || digits.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (version_dir_name(v) != name) return std::nullopt;  // one spelling per version
  return v;
}

Result<std::vector<int64_t>> list_versions(const std::string& dir) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) return Status::Error("cannot list " + dir + ": " + ec.message());
  std::vector<int64_t> out;
  for (; it != end; it.increment(ec)) {
    if (ec) return Status::Error("cannot list " + dir + ": " + ec.message());
    if (!it->is_directory(ec)) continue;
    if (auto v = parse_version_dir_name(it->path().filename().string())) out.push_back(*v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The same digits as miles::xxh3_128_hex (weight_sync.h; a test holds them equal), without the
// engine-side weight_set.cc (the fuzz build reads the format without an engine).
std::string xxh3_128_hex(std::span<const uint8_t> bytes) {
  return weight_sync_detail::xxh3_hex(bytes.data(), bytes.size());
}

int dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

std::optional<uint64_t> numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  return n;
}

std::optional<uint64_t> nbytes_of(std::string_view dtype, const std::vector<int64_t>& shape) {
  const std::optional<uint64_t> numel = numel_of(shape);
  uint64_t bytes = 0;
  if (!numel || __builtin_mul_overflow(*numel, static_cast<uint64_t>(dtype_bytes(dtype)), &bytes))
    return std::nullopt;
  return bytes;
}

Status zstd_check_frame_size(std::span<const uint8_t> frame, uint64_t size) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR) return Status::Error("not a zstd frame");
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != size)
    return Status::Error("zstd frame holds " + std::to_string(content) + " bytes, expected " +
                         std::to_string(size));
  return Status::Ok();
}

namespace {

struct DCtxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// The shortest run of one byte value that a kSmall frame stores as a match (the rest are literals).
constexpr size_t kMinRun = 16;

// Whether the 8 bytes at s are one value repeated.
bool one_value_word(const uint8_t* s) {
  uint64_t w;
  std::memcpy(&w, s, 8);
  return w == (w & 0xff) * 0x0101010101010101ull;
}

// zstd's block-level sequence producer for kSmall frames: every run of one byte value of at least
// kMinRun bytes is a match at offset 1 (its first byte a literal), every other byte a literal.
// zstd's own match finder covers a byte plane of float weights or of an update's difference with
// short matches that cost more to decode than they save: these blocks decode mostly as Huffman
// literals, faster, and come out smaller (docs/benchmarks.md, "Weight sync"), while the long zero
// runs of an update's high bytes stay a few bytes each. Any zstd decoder reads them. A run of
// kMinRun bytes holds an aligned 8-byte word of its value: the scan looks at those words only.
size_t runs_as_matches(void*, ZSTD_Sequence* out, size_t capacity, const void* src, size_t size,
                       const void*, size_t, int, size_t) {
  static_assert(kMinRun >= 15, "a shorter run need not hold an aligned word");
  const auto* s = static_cast<const uint8_t*>(src);
  size_t count = 0, literals_from = 0;
  for (size_t w = 0; w + 8 <= size; w += 8) {
    if (!one_value_word(s + w)) continue;
    size_t begin = w, end = w + 8;
    while (begin > literals_from && s[begin - 1] == s[w]) --begin;
    while (end + 8 <= size && one_value_word(s + end) && s[end] == s[w]) end += 8;
    while (end < size && s[end] == s[w]) ++end;
    if (end - begin >= kMinRun && count + 2 < capacity) {
      out[count++] = ZSTD_Sequence{1, static_cast<unsigned>(begin + 1 - literals_from),
                                   static_cast<unsigned>(end - begin - 1), 0};
      literals_from = end;
    }
    w = (end + 7) / 8 * 8 - 8;  // on to the first word at or after the run's end
  }
  out[count++] = ZSTD_Sequence{0, static_cast<unsigned>(size - literals_from), 0, 0};
  return count;
}

// out = a ^ b, 8 bytes at a time (the compiler vectorises the loop); out may be a.
void xor_bytes(uint8_t* out, const uint8_t* a, const uint8_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

// The difference payload of n bytes of elements of T: zigzag(a - b), wrapping (the compiler
// vectorises the loop).
template <typename T>
void zigzag_difference_of(uint8_t* out, const uint8_t* a, const uint8_t* b, size_t n) {
  constexpr int kBits = 8 * sizeof(T);
  for (size_t i = 0; i + sizeof(T) <= n; i += sizeof(T)) {
    T x, y;
    std::memcpy(&x, a + i, sizeof(T));
    std::memcpy(&y, b + i, sizeof(T));
    const T d = static_cast<T>(x - y);
    const T z = static_cast<T>(static_cast<T>(d << 1) ^ static_cast<T>(T{0} - (d >> (kBits - 1))));
    std::memcpy(out + i, &z, sizeof(T));
  }
}

void zigzag_difference(uint8_t* out, const uint8_t* a, const uint8_t* b, size_t n, int elem) {
  if (elem == 2) return zigzag_difference_of<uint16_t>(out, a, b, n);
  if (elem == 4) return zigzag_difference_of<uint32_t>(out, a, b, n);
  MILES_CHECK(elem == 8);
  zigzag_difference_of<uint64_t>(out, a, b, n);
}

// out += unzigzag(z), wrapping: the inverse of zigzag_difference_of for one element.
template <typename T>
void add_unzigzag(uint8_t* out, T z) {
  T x;
  std::memcpy(&x, out, sizeof(T));
  x = static_cast<T>(x + static_cast<T>((z >> 1) ^ static_cast<T>(T{0} - (z & 1))));
  std::memcpy(out, &x, sizeof(T));
}

}  // namespace

Result<size_t> zstd_encode_append(std::span<const uint8_t> bytes, const uint8_t* base,
                                  TensorEncoding encoding, TensorLayout layout, int elem, int level,
                                  std::vector<uint8_t>& out, bool raw_literals) {
  const bool planes = layout == TensorLayout::kBytePlanes;
  MILES_CHECK(!planes || (elem >= 2 && kPlaneBlock % elem == 0 && bytes.size() % elem == 0));
  MILES_CHECK(!applies_to_base(encoding) || base != nullptr);
  MILES_CHECK(encoding != TensorEncoding::kDifference ||
              (planes && (elem == 2 || elem == 4 || elem == 8)));
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> cctx(ZSTD_createCCtx());
  thread_local std::vector<uint8_t> payload, planed, staged(ZSTD_CStreamOutSize());
  if (!cctx) return Status::Error("zstd: cannot create a compression context");
  const auto failed = [](size_t code) {
    return Status::Error(std::string("zstd compression failed: ") + ZSTD_getErrorName(code));
  };
  ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
  if (const size_t r = ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
      ZSTD_isError(r))
    return failed(r);
  // An experimental parameter (zstd.h's static-linking section) whose value the linked library
  // checks: one that does not know it fails the publish with zstd's message, never silently.
  if (raw_literals) {
    if (const size_t r =
            ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_literalCompressionMode, ZSTD_ps_disable);
        ZSTD_isError(r))
      return failed(r);
  } else {
    ZSTD_registerSequenceProducer(cctx.get(), nullptr, runs_as_matches);  // until the next reset
  }
  ZSTD_CCtx_setPledgedSrcSize(cctx.get(), bytes.size());  // the frame declares its size
  const size_t at = out.size();
  size_t pos = 0;
  do {  // once for an empty tensor: the frame's header and end
    const size_t len = std::min(kPlaneBlock, bytes.size() - pos);
    const uint8_t* piece = bytes.data() + pos;
    if (applies_to_base(encoding)) {
      payload.resize(kPlaneBlock);
      if (encoding == TensorEncoding::kXor)
        xor_bytes(payload.data(), piece, base + pos, len);
      else
        zigzag_difference(payload.data(), piece, base + pos, len, elem);
      piece = payload.data();
    }
    if (planes) {
      planed.clear();
      append_byte_planes({piece, len}, elem, planed);
      piece = planed.data();
    }
    pos += len;
    const ZSTD_EndDirective end = pos == bytes.size() ? ZSTD_e_end : ZSTD_e_continue;
    ZSTD_inBuffer in{piece, len, 0};
    for (size_t left = 1; in.pos < in.size || (end == ZSTD_e_end && left != 0);) {
      ZSTD_outBuffer ob{staged.data(), staged.size(), 0};  // then appended: out is never padded
      left = ZSTD_compressStream2(cctx.get(), &ob, &in, end);
      if (ZSTD_isError(left)) {
        out.resize(at);
        return failed(left);
      }
      out.insert(out.end(), staged.data(), staged.data() + ob.pos);
    }
  } while (pos < bytes.size());
  return out.size() - at;
}

void append_byte_planes(std::span<const uint8_t> in, int elem, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + in.size());
  for (size_t b = 0; b < in.size(); b += kPlaneBlock) {
    const size_t len = std::min(kPlaneBlock, in.size() - b), m = len / elem;
    const uint8_t* src = in.data() + b;
    uint8_t* dst = out.data() + at + b;
    if (elem == 4) {
      for (size_t i = 0; i < m; ++i) {
        uint32_t w;
        std::memcpy(&w, src + 4 * i, 4);
        dst[i] = static_cast<uint8_t>(w);
        dst[m + i] = static_cast<uint8_t>(w >> 8);
        dst[2 * m + i] = static_cast<uint8_t>(w >> 16);
        dst[3 * m + i] = static_cast<uint8_t>(w >> 24);
      }
    } else {
      for (size_t i = 0; i < m; ++i)
        for (int j = 0; j < elem; ++j) dst[j * m + i] = src[i * elem + j];
    }
  }
}

namespace {

// 16 elements of 4 (or 2) bytes from their planes (byte-wise then pair-wise interleaves), stored
// as kEnc says: over out, xor'ed into it, or (difference) unzigzagged and added to it per element.
template <TensorEncoding kEnc, int kElem>
void store16(uint8_t* out, __m128i v) {
  const auto at = reinterpret_cast<__m128i*>(out);
  if constexpr (kEnc == TensorEncoding::kXor) {
    v = _mm_xor_si128(v, _mm_loadu_si128(at));
  } else if constexpr (kEnc == TensorEncoding::kDifference) {
    const __m128i one = kElem == 4 ? _mm_set1_epi32(1) : _mm_set1_epi16(1);
    const __m128i odd = _mm_and_si128(v, one);  // 1 where the difference is negative
    const __m128i zero = _mm_setzero_si128();
    const __m128i d = kElem == 4 ? _mm_xor_si128(_mm_srli_epi32(v, 1), _mm_sub_epi32(zero, odd))
                                 : _mm_xor_si128(_mm_srli_epi16(v, 1), _mm_sub_epi16(zero, odd));
    const __m128i x = _mm_loadu_si128(at);
    v = kElem == 4 ? _mm_add_epi32(x, d) : _mm_add_epi16(x, d);
  }
  _mm_storeu_si128(at, v);
}

template <TensorEncoding kEnc>
size_t from_planes4(const uint8_t* p, size_t m, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const auto ld = [&](int j) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * m + i));
    };
    const __m128i a = ld(0), b = ld(1), c = ld(2), d = ld(3);
    const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
    const __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
    uint8_t* o = out + 4 * i;
    store16<kEnc, 4>(o, _mm_unpacklo_epi16(ab_lo, cd_lo));
    store16<kEnc, 4>(o + 16, _mm_unpackhi_epi16(ab_lo, cd_lo));
    store16<kEnc, 4>(o + 32, _mm_unpacklo_epi16(ab_hi, cd_hi));
    store16<kEnc, 4>(o + 48, _mm_unpackhi_epi16(ab_hi, cd_hi));
  }
  return i;
}

template <TensorEncoding kEnc>
size_t from_planes2(const uint8_t* p, size_t m, uint8_t* out) {
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + m + i));
    store16<kEnc, 2>(out + 2 * i, _mm_unpacklo_epi8(a, b));
    store16<kEnc, 2>(out + 2 * i + 16, _mm_unpackhi_epi8(a, b));
  }
  return i;
}

template <TensorEncoding kEnc>
size_t from_planes(const uint8_t* p, size_t m, int elem, uint8_t* out) {
  return elem == 4 ? from_planes4<kEnc>(p, m, out) : elem == 2 ? from_planes2<kEnc>(p, m, out) : 0;
}

// Element i (of elem bytes) gathered from its planes, little-endian.
uint64_t gather_element(const uint8_t* planes, size_t m, int elem, size_t i) {
  uint64_t v = 0;
  for (int j = 0; j < elem; ++j) v |= uint64_t{planes[j * m + i]} << (8 * j);
  return v;
}

}  // namespace

void from_byte_planes(const uint8_t* planes, size_t len, int elem, uint8_t* out,
                      TensorEncoding encoding) {
  const size_t m = len / elem;
  size_t i = 0;  // the elements the vector paths did
  switch (encoding) {
    case TensorEncoding::kXor:
      i = from_planes<TensorEncoding::kXor>(planes, m, elem, out);
      for (; i < m; ++i)
        for (int j = 0; j < elem; ++j) out[i * elem + j] ^= planes[j * m + i];
      return;
    case TensorEncoding::kDifference:
      MILES_CHECK(elem == 2 || elem == 4 || elem == 8);
      i = from_planes<TensorEncoding::kDifference>(planes, m, elem, out);
      for (; i < m; ++i) {
        const uint64_t z = gather_element(planes, m, elem, i);
        if (elem == 2) add_unzigzag<uint16_t>(out + i * elem, static_cast<uint16_t>(z));
        if (elem == 4) add_unzigzag<uint32_t>(out + i * elem, static_cast<uint32_t>(z));
        if (elem == 8) add_unzigzag<uint64_t>(out + i * elem, z);
      }
      return;
    default:
      i = from_planes<TensorEncoding::kFull>(planes, m, elem, out);
      for (; i < m; ++i)
        for (int j = 0; j < elem; ++j) out[i * elem + j] = planes[j * m + i];
  }
}

Status zstd_decode_pieces(const FrameChunks& next_chunk, std::span<uint8_t> out,
                          TensorEncoding encoding, TensorLayout layout, int elem,
                          const std::function<void(std::span<const uint8_t>)>& piece_done) {
  MILES_ASSIGN_OR_RETURN(std::span<const uint8_t> chunk, next_chunk());
  MILES_RETURN_IF_ERROR(zstd_check_frame_size(chunk, out.size()));  // the header is in the first
  const bool planes = layout == TensorLayout::kBytePlanes;
  MILES_CHECK(!planes || (elem >= 2 && kDecodePiece % elem == 0 && out.size() % elem == 0));
  MILES_CHECK(encoding != TensorEncoding::kDifference || (planes && elem >= 2));
  const bool xor_into = encoding == TensorEncoding::kXor;
  const bool via_piece = applies_to_base(encoding) || planes;  // else zstd writes into out
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> dctx(ZSTD_createDCtx());
  thread_local std::vector<uint8_t> piece;
  if (!dctx) return Status::Error("zstd: cannot create a decompression context");
  ZSTD_DCtx_reset(dctx.get(), ZSTD_reset_session_only);
  // The decoder's window never needs to exceed the output (a writer's frame declares at most that:
  // zstd fits the window to the input, 1 KiB at least); a hostile frame that declares more is
  // refused instead of allocating up to zstd's default limit of 128 MiB.
  int window_log = 10;
  while (window_log < 27 && (size_t{1} << window_log) < out.size()) ++window_log;
  ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, window_log);
  if (via_piece && piece.size() < kDecodePiece) piece.resize(kDecodePiece);
  ZSTD_inBuffer in{chunk.data(), chunk.size(), 0};
  size_t pos = 0, left_in_frame = 1;  // ZSTD_decompressStream's hint: 0 once the frame is complete
  const auto corrupt = [](size_t code) {
    return Status::Error(std::string("corrupt zstd frame: ") + ZSTD_getErrorName(code));
  };
  // One decompression call, with the next chunk of the frame once the last one is used up.
  const auto step = [&](ZSTD_outBuffer& ob) -> Status {
    if (in.pos == in.size) {
      MILES_ASSIGN_OR_RETURN(chunk, next_chunk());
      in = {chunk.data(), chunk.size(), 0};
    }
    const size_t in_before = in.pos, out_before = ob.pos;
    left_in_frame = ZSTD_decompressStream(dctx.get(), &ob, &in);
    if (ZSTD_isError(left_in_frame)) return corrupt(left_in_frame);
    if (in.pos == in_before && ob.pos == out_before)
      return Status::Error("zstd frame ends early: decoded " + std::to_string(pos + ob.pos) +
                           " of " + std::to_string(out.size()) + " bytes");
    return Status::Ok();
  };
  while (pos < out.size() && left_in_frame != 0) {
    const size_t len = std::min(kDecodePiece, out.size() - pos);
    ZSTD_outBuffer ob{via_piece ? piece.data() : out.data() + pos, len, 0};
    while (ob.pos < ob.size && left_in_frame != 0) MILES_RETURN_IF_ERROR(step(ob));
    if (ob.pos < len) {  // the frame ended early (reported below): the piece is not applied
      pos += ob.pos;
      break;
    }
    if (planes)
      from_byte_planes(piece.data(), len, elem, out.data() + pos, encoding);
    else if (xor_into)
      xor_bytes(out.data() + pos, out.data() + pos, piece.data(), len);
    piece_done(std::span<const uint8_t>(out.data() + pos, ob.pos));
    pos += ob.pos;
  }
  if (pos != out.size())
    return Status::Error("zstd frame decoded to " + std::to_string(pos) + " bytes, expected " +
                         std::to_string(out.size()));
  uint8_t extra = 0;
  while (left_in_frame != 0) {  // out is full: the frame must end with nothing more to give
    ZSTD_outBuffer ob{&extra, 1, 0};
    MILES_RETURN_IF_ERROR(step(ob));
    if (ob.pos != 0)
      return Status::Error("zstd frame decodes to more than " + std::to_string(out.size()) +
                           " bytes");
  }
  size_t after = in.size - in.pos;
  if (after == 0) {
    MILES_ASSIGN_OR_RETURN(chunk, next_chunk());
    after = chunk.size();
  }
  if (after != 0) return Status::Error("bytes follow the zstd frame");
  return Status::Ok();
}

Result<DataFile> DataFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status::Error("cannot stat " + path + ": " + why);
  }
  return DataFile(fd, path, static_cast<uint64_t>(st.st_size));
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

FrameChunks DataFile::chunks(uint64_t offset, uint64_t n) const {
  return [this, at = offset, end = offset + n]() mutable -> Result<std::span<const uint8_t>> {
    thread_local std::vector<uint8_t> buf(kReadChunk);
    const uint64_t want = std::min(kReadChunk, end - at);
    uint64_t got = 0;
    while (got < want) {
      const ssize_t r = ::pread(fd_, buf.data() + got, want - got, static_cast<off_t>(at + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::Error("cannot read " + path_ + ": " + std::strerror(errno));
      if (r == 0)
        return Status::Error(path_ + " ends at byte " + std::to_string(at + got) +
                             ", inside a frame that ends at " + std::to_string(end));
      got += static_cast<uint64_t>(r);
    }
    at += want;
    return std::span<const uint8_t>(buf.data(), want);
  };
}

Status write_file_synced(const std::string& path, std::span<const uint8_t> bytes) {
  return ::miles::write_file_synced(path, bytes.data(), bytes.size());
}

Status fsync_dir(const std::string& dir) { return sync_dir(dir); }

Result<std::vector<uint8_t>> read_file(const std::string& path) { return read_file_bytes(path); }

}  // namespace miles::disk_delta
