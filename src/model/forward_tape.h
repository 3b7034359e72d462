// ForwardTape::Impl: the activations a training forward keeps for Model::backward.
//
// Shapes with T = tokens of the packed batch, d = hidden, ld = q_dim + 2 kv_dim, f = intermediate.
#pragma once

#include <cstdint>
#include <vector>

#include "miles/model.h"

namespace miles {

struct ExpertTape {
  std::vector<int64_t> slots;  // slot = token * top_k + j, ascending
  std::vector<float> gate_up;  // (n, 2 f_moe) before SwiGLU
  std::vector<float> act;      // (n, f_moe)
};

struct MoeTape {
  std::vector<float> probs;    // (T, experts) router softmax
  std::vector<int32_t> ids;    // (T, top_k)
  std::vector<float> weights;  // (T, top_k) gate weights used (renormalised when configured)
  std::vector<float> y;        // (T * top_k, d) expert outputs per slot
  std::vector<ExpertTape> experts;
};

struct LayerTape {
  std::vector<float> h_in;     // (T, d) residual stream entering the layer
  std::vector<float> xn1;      // (T, d) input_layernorm output
  std::vector<float> qkv_raw;  // (T, ld) projections (+ bias), before q/k norm and RoPE
  std::vector<float> qkv;      // (T, ld) after q/k norm and RoPE: what attention saw
  std::vector<float> attn;     // (T, q_dim) attention output before o_proj
  std::vector<float> h_mid;    // (T, d) after the attention residual
  std::vector<float> xn2;      // (T, d) post_attention_layernorm output
  std::vector<float> gate_up;  // dense: (T, 2 f)
  std::vector<float> act;      // dense: (T, f)
  MoeTape moe;
};

struct ForwardTape::Impl {
  std::vector<int32_t> tokens;  // (T)
  std::vector<SeqSpan> seqs;
  std::vector<int64_t> offset;     // (S) first token of each sequence
  std::vector<int32_t> positions;  // (T)
  int64_t layer_begin = 0, layer_end = 0;  // the layers this forward ran
  std::vector<LayerTape> layers;            // (num_layers); those in range filled
  std::vector<float> h_final;  // (T, d) before the final norm
  std::vector<float> normed;   // (T, d) after the final norm (the LM head's input)
};

}  // namespace miles
