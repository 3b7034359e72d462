// Checkpoint IO: Hugging Face safetensors (single file or sharded with an index) and llama2.c files.
//
// Why: users bring HF directories; the trainer writes them back. Readers memory-map files, check every
// offset, dtype and shape against the file before exposing a byte, and name the file and tensor in errors.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "miles/model_config.h"
#include "miles/status.h"
#include "miles/tensor.h"

namespace miles {

// Named tensors from one or more files. Tensors are views that keep their mapped file alive.
class TensorMap {
 public:
  void insert(std::string name, Tensor tensor, std::string source_file);
  const Tensor* find(const std::string& name) const;
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  // The tensor, checked to be present and of the given shape; the error names tensor and file.
  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::string& source(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return tensors_.size(); }

 private:
  struct Entry {
    Tensor tensor;
    std::string source;
  };
  std::map<std::string, Entry> tensors_;
};

// One .safetensors file, memory-mapped.
Result<TensorMap> read_safetensors(const std::string& path);
// Parses a safetensors image already in memory (used by the fuzzer); `owner` keeps `data` alive.
Result<TensorMap> parse_safetensors(const uint8_t* data, size_t size, const std::string& source,
                                    std::shared_ptr<const void> owner);
// Metadata (`__metadata__`) of one file.
Result<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path);
// An HF model directory: model.safetensors, or model.safetensors.index.json and its shards.
Result<TensorMap> read_hf_weights(const std::string& dir);

// Writes one safetensors file atomically (temporary file, fsync, rename). Tensors in the given order.
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// A llama2.c checkpoint ("version 1" with the ak42 magic, or the legacy run.c format), exposed as an HF
// Llama checkpoint: HF tensor names, q/k rows permuted from interleaved to half-split rotary pairs.
struct Llama2cModel {
  ModelConfig config;
  TensorMap weights;
};
Result<Llama2cModel> read_llama2c(const std::string& path);

}  // namespace miles
