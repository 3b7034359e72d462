// GGUF (v2/v3) files: metadata and tensors, memory-mapped, every count, length, offset and
// alignment checked against the file before use.
//
// Why: users bring llama.cpp checkpoints (SmolLM2 ships as GGUF); `miles convert` turns them into
// HF directories, and GGUF-embedded tokenizers and chat templates are read from the metadata.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "miles/status.h"
#include "miles/tensor.h"

namespace miles {

// GGUF metadata value types (the numbers are the file format's).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Scalars use the field of their kind; arrays hold one element type.
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;  // every integer type and bool (u64 values above INT64_MAX are rejected)
  double f = 0;   // f32 / f64
  std::string s;  // string
  GgufType elem = GgufType::kU8;     // arrays: element type (nested arrays are rejected)
  std::vector<int64_t> ints;         // integer / bool arrays
  std::vector<double> floats;        // float arrays
  std::vector<std::string> strings;  // string arrays
};

// ggml tensor types this reader dequantises (the numbers are ggml's).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the fastest-varying (row length)
  uint32_t type = 0;        // GgmlType value
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping, bounds-checked
};

// A GGUF (version 3) holding only `metadata`, no tensors: a vocabulary-only file, as llama.cpp's
// ggml-vocab-*.gguf. Each value keeps its type (an array its element type). The bytes; the caller
// writes them.
std::string gguf_metadata_image(const std::map<std::string, GgufValue>& metadata);

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);
  // Parses an image in memory (fuzzing); `owner` keeps `data` alive.
  static Result<GgufFile> parse(const uint8_t* data, size_t size, const std::string& source,
                                std::shared_ptr<const void> owner);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters; errors name the file and the key (missing, or of another type).
  Result<std::string> get_string(const std::string& key) const;
  Result<int64_t> get_int(const std::string& key) const;   // any integer type
  Result<double> get_float(const std::string& key) const;  // f32/f64, or an integer
  Result<bool> get_bool(const std::string& key) const;
  Result<std::vector<std::string>> get_strings(const std::string& key) const;
  Result<std::vector<double>> get_floats(const std::string& key) const;
  Result<std::vector<int64_t>> get_ints(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // The tensor as float32, shape reversed into row-major order ([ne1, ne0] for a matrix).
  Result<Tensor> dequantize(const GgufTensorInfo& t) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::shared_ptr<const void> owner_;
};

}  // namespace miles
