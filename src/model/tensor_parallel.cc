// Slicing parameters into tensor-parallel shards and assembling them back (tensor_parallel.h).
#include "miles/tensor_parallel.h"

#include <algorithm>

#include "miles/kernels.h"

namespace miles::tensor_parallel {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Split split_of(const std::string& n) {
  if (n == "model.embed_tokens.weight" || n == "lm_head.weight") return Split::kRows;
  for (const char* s : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias",
                        "k_proj.bias", "v_proj.bias", "gate_proj.weight", "up_proj.weight",
                        "gate_proj.bias", "up_proj.bias", "q_b_proj.weight", "kv_b_proj.weight"})
    if (ends_with(n, s)) return Split::kRows;
  if (ends_with(n, "o_proj.weight") || ends_with(n, "down_proj.weight")) return Split::kCols;
  return Split::kReplicated;
}

Result<ModelConfig> local_config(const ModelConfig& full, int size) {
  if (full.is_mla() && full.mla.q_lora_rank == 0 && size > 1)
    return Status::Error(full.arch_name + ": tensor parallelism (tp=" + std::to_string(size) +
                         ") of multi-head latent attention (MLA) without q_lora_rank (q_proj fused "
                         "with the replicated kv_a_proj_with_mqa) is not implemented");
  auto need = [&](int64_t v, const char* what) -> Status {
    if (v % size != 0)
      return Status::Error(std::string(what) + " = " + std::to_string(v) +
                           " does not split over tp=" + std::to_string(size));
    return Status::Ok();
  };
  MILES_RETURN_IF_ERROR(need(full.num_heads, "num_attention_heads"));
  // MLA's one latent kv head is replicated; its query heads split.
  if (!full.is_mla()) MILES_RETURN_IF_ERROR(need(full.num_kv_heads, "num_key_value_heads"));
  MILES_RETURN_IF_ERROR(need(full.vocab_size, "vocab_size"));
  MILES_RETURN_IF_ERROR(need(full.intermediate_size, "intermediate_size"));
  if (full.moe.num_experts > 0)
    MILES_RETURN_IF_ERROR(need(full.moe.moe_intermediate_size, "moe_intermediate_size"));
  ModelConfig c = full;
  c.num_heads /= size;
  if (!full.is_mla()) c.num_kv_heads /= size;
  c.mla.num_key_value_heads /= size;
  c.vocab_size /= size;
  c.intermediate_size /= size;
  c.moe.moe_intermediate_size /= size;
  c.tensor_parallel = full.tensor_parallel * size;
  return c;
}

Status bitwise_split(const ModelConfig& full, int size) {
  if (size == 1) return Status::Ok();
  const std::string tp = "tp=" + std::to_string(size);
  if ((size & (size - 1)) != 0)
    return Status::Error(tp +
                         " is not a power of two: the halving tree over ranks cannot match "
                         "the tree over K chunks");
  auto gemm_k = [&](int64_t k, const char* what) -> Status {
    const int64_t c = kernels::gemm_chunk(k);
    if (k % c != 0 || (k / c) % size != 0)
      return Status::Error(std::string(what) + " = " + std::to_string(k) +
                           " reduces in chunks of " + std::to_string(c) + ": " + tp +
                           " does not split it on chunk boundaries");
    return Status::Ok();
  };
  MILES_RETURN_IF_ERROR(gemm_k(full.is_mla() ? full.num_heads * full.mla.v_head_dim : full.q_dim(),
                               "o_proj K (heads x head_dim)"));
  MILES_RETURN_IF_ERROR(gemm_k(full.intermediate_size, "down_proj K (intermediate_size)"));
  if (full.moe.num_experts > 0)
    MILES_RETURN_IF_ERROR(gemm_k(full.moe.moe_intermediate_size, "expert down_proj K"));
  if (full.moe.n_shared_experts > 0)
    MILES_RETURN_IF_ERROR(gemm_k(full.moe.n_shared_experts * full.moe.moe_intermediate_size,
                                 "shared expert down_proj K"));
  const int64_t v = full.vocab_size, c = kernels::kGemmChunk;
  if (v % c != 0 || (v / c) % size != 0)
    return Status::Error("vocab_size = " + std::to_string(v) + " sums its softmax in chunks of " +
                         std::to_string(c) + ": " + tp + " does not split it on chunk boundaries");
  return Status::Ok();
}

void slice(const FlatTensors& full, FlatTensors& local, int rank, int size) {
  for (const ParamSpec& l : local.layout().specs()) {
    const ParamSpec& f = full.layout().at(l.name);
    std::span<const float> src = full.get(l.name);
    std::span<float> dst = local.get(l.name);
    switch (split_of(l.name)) {
      case Split::kReplicated:
        std::copy(src.begin(), src.end(), dst.begin());
        break;
      case Split::kRows:  // contiguous block of rows (or of a bias vector)
        std::copy_n(src.begin() + rank * l.numel, l.numel, dst.begin());
        break;
      case Split::kCols: {
        const int64_t rows = f.shape[0], cols = f.shape[1], lc = cols / size;
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(src.begin() + r * cols + rank * lc, lc, dst.begin() + r * lc);
        break;
      }
    }
  }
}

void assemble(const std::string& name, const std::vector<int64_t>& shape,
              std::span<const float> gathered, int size, std::span<float> out) {
  const int64_t per_rank = gathered.size() / size;
  switch (split_of(name)) {
    case Split::kReplicated:
      std::copy_n(gathered.begin(), per_rank, out.begin());  // rank 0's copy
      break;
    case Split::kRows:
      std::copy(gathered.begin(), gathered.end(), out.begin());
      break;
    case Split::kCols: {
      const int64_t rows = shape[0], cols = shape[1], lc = cols / size;
      for (int k = 0; k < size; ++k)
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(gathered.begin() + k * per_rank + r * lc, lc,
                      out.begin() + r * cols + k * lc);
      break;
    }
  }
}

}  // namespace miles::tensor_parallel
