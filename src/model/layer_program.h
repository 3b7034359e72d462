// The decoder layer, described once: a short program of ops over named activations, made from a
// layer's configuration and weights. Both backends run it, the CPU kernels (model.cc's forward,
// model_backward.cc's backward) and the device functors (device_forward_impl.h,
// device_backward_impl.h): the forward walks the ops in order, the backward in reverse. A variant
// of an architecture (another norm placement, a bias, a gated activation) is a change here; a new
// kind of op is one case in each backend's forward and backward, each checked bit for bit against
// the other alone (tests/layer_program_test.cc).
//
// Data flow. Every op reads `in` and writes `out` (in == out: in place). The residual stream kH is
// the only activation read by several ops, so in the backward:
//   - kResidual (h += in) hands d h to d in unchanged (the same storage);
//   - kRmsNorm of the stream adds its input gradient into d in; a norm of a block's output (Gemma
//   3's post-norms: kAttnOut, kMlpOut, whose one reader it is) writes d in whole;
//   - every other op writes d in whole (its input has no other reader; in place ops transform d
//   out).
// check_program() states these rules as checks.
//
// Keeping for the backward. A training forward keeps every activation an op's backward reads
// (keeps()): the inputs of norms, projections, RoPE, attention, activations and MoE blocks. The
// residual stream changes as the layer runs, so a norm of it names where its input is kept (`keep`:
// kHIn, kHMid); without a tape those names are the stream itself.
//
// Tensor parallelism (Megatron's f and g): kTpEnter marks a replicated activation entering a
// column-parallel projection (identity forward, the input gradient summed over the group in the
// backward), kTpExit a row-parallel projection's partial output (summed over the group in the
// forward, identity backward). The MoE block does both inside itself (moe.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "miles/model_config.h"

namespace miles {

struct LayerWeights;

// A layer's activations, [T, act_width] each.
enum class Act : uint8_t {
  kH,        // the residual stream
  kHIn,      // kept: the stream entering the attention block
  kXn1,      // input_layernorm's output
  kQkvRaw,   // the fused q/k/v projection (+ bias), before q/k norms and RoPE
  kQkv,      // after them: what attention reads (its k and v go to the KV cache)
  kAttn,     // attention's output, before o_proj
  kProj,     // a block's output (o_proj, down_proj or the MoE block), before the residual add
  kHMid,     // kept: the stream after the attention block
  kXn2,      // post_attention_layernorm's output (Gemma 3: pre_feedforward_layernorm's)
  kGateUp,   // the fused gate/up projection
  kAct,      // the gated activation
  kAttnOut,  // Gemma 3: o_proj's output, before post_attention_layernorm
  kMlpOut,   // Gemma 3: down_proj's output, before post_feedforward_layernorm
  kMlaA,     // MLA: the fused [q_a | q; kv_a] projection's output (mla.h)
  kAttnV,    // MLA: each head's value output, o_proj's input
  kCount,
};
inline constexpr int kNumActs = static_cast<int>(Act::kCount);

// A layer's parameters an op uses.
enum class Param : uint8_t {
  kNone,
  kInputNorm,    // input_layernorm.weight
  kQkv,          // [q; k; v]_proj.weight
  kQkvBias,      // [q; k; v]_proj.bias
  kQkNorm,       // q_norm.weight, k_norm.weight (per head)
  kO,            // o_proj.weight
  kOBias,        // o_proj.bias
  kPostNorm,     // post_attention_layernorm.weight (Gemma 3: pre_feedforward_layernorm.weight)
  kGateUp,       // [gate; up]_proj.weight
  kDown,         // down_proj.weight
  kGateUpBias,   // [gate; up]_proj.bias (mlp_bias)
  kDownBias,     // down_proj.bias (mlp_bias)
  kMoe,          // the router and every expert
  kAttnOutNorm,  // Gemma 3: post_attention_layernorm.weight
  kMlpOutNorm,   // Gemma 3: post_feedforward_layernorm.weight
  kMla,          // MLA's q_a_layernorm, q_b_proj, kv_a_layernorm, kv_b_proj (mla.h)
};

enum class OpKind : uint8_t {
  kRmsNorm,    // out = rmsnorm(in) · param, per row
  kLinear,     // out = in · paramᵀ
  kBias,       // out += param per row (in place)
  kRope,       // out = RoPE(in), with the per-head q/k norms first when param is kQkNorm
  kAttention,  // in's keys and values into the KV cache; out = causal attention of in's queries
  kSwiGlu,     // out = silu(in[:, :f]) · in[:, f:]
  kGeGlu,      // out = gelu_tanh(in[:, :f]) · in[:, f:]
  kMoe,        // out = the MoE block of in (router, top-k experts, combined)
  kResidual,   // out (the stream) += in
  kTpEnter,    // identity; backward: d in summed over the tensor-parallel group (in place)
  kTpExit,     // in summed over the tensor-parallel group; backward: identity (in place)
  kMlaQkv,     // MLA: the a-projection's output → q/k/v rows before RoPE (mla.h)
  kMlaOut,     // MLA: the attention's latent output → each head's value output (mla.h)
};

struct Op {
  OpKind kind;
  Act in, out;
  Param param = Param::kNone;
  Act keep = Act::kCount;  // kRmsNorm of the stream: where its input is kept for the backward
};

struct LayerProgram {
  std::vector<Op> ops;
  // A MoE layer's place among the model's MoE layers: its slice of the routing record and of
  // replayed experts ([tokens, moe layers, top_k]); -1 for a dense layer.
  int64_t moe_index = -1;
  // The attention's sliding window (ModelConfig::attention_window): a query at p sees keys
  // p − window + 1 .. p; 0: all of 0 .. p.
  int64_t window = 0;
  // Whether RoPE uses the model's local table (ModelConfig::uses_local_rope).
  bool local_rope = false;
  std::array<bool, kNumActs> kept{};  // what a training forward keeps (keeps())
  bool keeps(Act a) const { return kept[static_cast<int>(a)]; }
};

// The program of decoder layer `layer` with these weights (a bias or q/k norm the checkpoint has, a
// dense MLP or a MoE block).
LayerProgram describe_layer(const ModelConfig& config, int64_t layer, const LayerWeights& weights);

// Floats per token of an activation.
int64_t act_width(const ModelConfig& config, Act a);

// Where an activation lives when nothing is kept: activations that are never live at once share
// storage (the two norm outputs; the projection before and after RoPE, which then runs in place;
// the kept copies of the stream are the stream).
Act scratch_home(Act a);

// Where an activation's gradient lives in the backward, by the rules above: the stream's and the
// block output's are one (kH); the others are written whole by their one reader and never live at
// once within a class: the norm outputs (kXn1), the narrow inputs of the output projections (kAttn:
// attn, act), the wide ones (kQkvRaw: qkv_raw, qkv, gate_up).
Act grad_home(Act a);

// A parameter's tensors in the checkpoint's names (layer prefix included) with their rows, in the
// order the fused matrix or vector stacks them: the gradients' destinations.
std::vector<std::pair<std::string, int64_t>> param_parts(const ModelConfig& config, int64_t layer,
                                                         Param p);

// The data-flow rules above, checked on a program: an empty string when it keeps them, else what
// breaks them.
std::string check_program(const LayerProgram& program);

const char* op_name(OpKind kind);
const char* act_name(Act a);

}  // namespace miles
