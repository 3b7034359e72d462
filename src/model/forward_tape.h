// ForwardTape::Impl: the activations a training forward keeps for Model::backward.
//
// Shapes with T = tokens of the packed batch, d = hidden.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "miles/model.h"
#include "model/layer_program.h"

namespace miles {

struct ExpertTape {
  std::vector<int64_t> slots;  // slot = token * top_k + j, ascending
  std::vector<float> gate_up;  // (n, 2 f_moe) before SwiGLU
  std::vector<float> act;      // (n, f_moe)
};

struct MoeTape {
  std::vector<float> probs;    // (T, experts) router softmax (sigmoid routing: the sigmoid scores)
  std::vector<int32_t> ids;    // (T, top_k)
  std::vector<float> weights;  // (T, top_k) gate weights used (renormalised when configured)
  std::vector<float> y;        // (T * top_k, d) expert outputs per slot, then (T, d) shared's
  std::vector<ExpertTape> experts;
  ExpertTape shared;  // the shared expert's (slots: every token)
};

// The activations of one layer a training forward keeps (LayerProgram::keeps): (T, act_width).
struct LayerTape {
  std::array<std::vector<float>, kNumActs> acts;
  MoeTape moe;
  std::vector<float>& operator[](Act a) { return acts[static_cast<int>(a)]; }
  const std::vector<float>& operator[](Act a) const { return acts[static_cast<int>(a)]; }
};

struct ForwardTape::Impl {
  std::vector<int32_t> tokens;  // (T)
  std::vector<SeqSpan> seqs;
  std::vector<int64_t> offset;     // (S) first token of each sequence
  std::vector<int32_t> positions;  // (T)
  int64_t layer_begin = 0, layer_end = 0;  // the layers this forward ran
  bool embedded = true;  // the input was the embedding of tokens (not ForwardOptions::input_hidden)
  std::vector<const Impl*> earlier;  // ForwardOptions::earlier_passes (a training-time test pass)
  std::vector<LayerTape> layers;            // (num_layers); those in range filled
  std::vector<int64_t> head_rows;  // (R) the token rows the LM head ran on (all T, or logit_rows)
  std::vector<float> h_final;      // (R, d) before the final norm
  std::vector<float> normed;       // (R, d) after the final norm (the LM head's input)
  // (num_layers) d qkv rows [T, q + 2 kv wide] that later training-time-test passes' backwards
  // sent to this pass's keys and values (BackwardIo::earlier_passes); empty where none was sent.
  std::vector<std::vector<float>> sent_dqkv;
};

}  // namespace miles
