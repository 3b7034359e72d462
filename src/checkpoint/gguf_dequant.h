// ggml tensor types: their block geometry, and dequantisation of whole blocks to float32.
//
// Why: a GGUF tensor's byte size follows from its type's block size and block bytes, which the
// reader must know for every type it may meet (to bounds-check files whose tensors it cannot
// decode), while only the types real checkpoints mostly use are decoded: F32, F16, BF16, Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, the k-quants Q2_K ... Q6_K (every tensor of llama.cpp's Q2_K ... Q6_K
// mixes) and IQ4_NL / IQ4_XS; not the other i-quants, with their code-book grids. The block layouts
// are ggml's (ggml-common.h); the arithmetic follows ggml's reference dequantisers operation by
// operation, so the results are bitwise those of the `gguf` Python package.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace miles::gguf {

struct GgmlTypeTraits {
  const char* name;     // "Q4_K"
  int64_t block_elems;  // elements per block (1 for plain types)
  int64_t block_bytes;  // bytes per block
  bool dequantizable;   // dequantize_blocks() handles it
};

// The traits of a ggml type number, or nullopt when the number is not a ggml type.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);

// "Q4_K", or "type 99" for a number that is not a ggml type.
std::string ggml_type_name(uint32_t type);

// Comma-separated names of the types dequantize_blocks() handles (for error messages).
std::string dequantizable_type_names();

// Decodes `n_blocks` consecutive blocks of `type` at `src` (n_blocks * block_bytes bytes, any
// alignment) into n_blocks * block_elems floats at `dst`.
// note: call only for a type whose traits say dequantizable; anything else is an invariant
// violation.
void dequantize_blocks(uint32_t type, const uint8_t* src, int64_t n_blocks, float* dst);

// IEEE half -> float, exact, NaN payloads kept (as numpy and F16C hardware do).
float half_to_float(uint16_t h);

}  // namespace miles::gguf
