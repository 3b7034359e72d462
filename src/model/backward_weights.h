// BackwardWeights: the transposed packs of every matrix (d x = d y · W), built once per Model.
#pragma once

#include <vector>

#include "miles/kernels.h"
#include "model/mla.h"

namespace miles {

struct ExpertWeightsT {
  kernels::PackedMatrix gate_up_t;  // (hidden, 2 f_moe)
  kernels::PackedMatrix down_t;     // (f_moe, hidden)
};

struct LayerWeightsT {
  kernels::PackedMatrix qkv_t;      // (hidden, q_dim + 2 kv_dim)
  kernels::PackedMatrix o_t;        // (q_dim, hidden)
  kernels::PackedMatrix gate_up_t;  // dense: (hidden, 2 f)
  kernels::PackedMatrix down_t;     // dense: (f, hidden)
  kernels::PackedMatrix router_t;   // moe: (hidden, experts)
  std::vector<ExpertWeightsT> experts;
  ExpertWeightsT shared;  // moe with a shared expert
  MlaWeightsT mla;
};

struct BackwardWeights {
  std::vector<LayerWeightsT> layers;
  kernels::PackedMatrix lm_head_t;  // (hidden, vocab)
};

}  // namespace miles
