// Tensor-parallel sharding of the trainer's parameters (Megatron's layout): q/k/v, gate/up rows and
// the vocabulary rows of the embedding and LM head are split across ranks (column-parallel in
// Megatron's terms), o_proj and down_proj columns (row-parallel); norms, biases of row-parallel
// layers and the MoE router are replicated.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "miles/flat_params.h"
#include "miles/model_config.h"
#include "miles/status.h"

namespace miles::tensor_parallel {

enum class Split { kReplicated, kRows, kCols };
Split split_of(const std::string& name);

// The config of one rank's shard: heads, KV heads, intermediate sizes and vocabulary divided by
// `size`; errors name what does not divide.
Result<ModelConfig> local_config(const ModelConfig& full, int size);

// Ok when a `size`-way split of `full` reproduces the single-process forward bit for bit (the
// row-parallel K reductions and the vocabulary's softmax sums split on chunk boundaries, size a
// power of two); otherwise an error naming the dimension that does not (the result is then within
// float rounding, not bitwise).
Status bitwise_split(const ModelConfig& full, int size);

// Copies rank `rank`'s slice of every tensor of `full` into `local` (same names, shard shapes).
void slice(const FlatTensors& full, FlatTensors& local, int rank, int size);
// Writes the full tensor `name` from the `size` shards gathered in rank order (`gathered`: each
// rank's local tensor, concatenated).
void assemble(const std::string& name, const std::vector<int64_t>& full_shape,
              std::span<const float> gathered, int size, std::span<float> out);

}  // namespace miles::tensor_parallel
