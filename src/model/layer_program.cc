// The decoder layer's program (layer_program.h): the layers of every supported family.
#include "model/layer_program.h"

#include "model/mla.h"
#include "model/model_weights.h"

namespace miles {

namespace {

bool in_place_kind(OpKind k) {
  return k == OpKind::kBias || k == OpKind::kTpEnter || k == OpKind::kTpExit;
}

// What an op's backward reads of the forward (nothing for the in-place ops and the residual add).
Act read_by_backward(const Op& op) {
  switch (op.kind) {
    case OpKind::kRmsNorm:
      return op.keep != Act::kCount ? op.keep : op.in;
    case OpKind::kLinear:
    case OpKind::kRope:
    case OpKind::kAttention:
    case OpKind::kSwiGlu:
    case OpKind::kGeGlu:
    case OpKind::kMoe:
    case OpKind::kMlaQkv:
    case OpKind::kMlaOut:
      return op.in;
    case OpKind::kBias:
    case OpKind::kResidual:
    case OpKind::kTpEnter:
    case OpKind::kTpExit:
      return Act::kCount;
  }
  return Act::kCount;
}

// MLA (mla.h): norm → [q_a | q; kv_a] → q/k/v rows → RoPE → attention → value outputs → o_proj →
// residual. Under tensor parallelism the heads split after the latent norms: the q/k/v op sums its
// latent gradients over the group itself (no kTpEnter).
void mla_block(std::vector<Op>& ops) {
  ops.push_back({OpKind::kRmsNorm, Act::kH, Act::kXn1, Param::kInputNorm, Act::kHIn});
  ops.push_back({OpKind::kLinear, Act::kXn1, Act::kMlaA, Param::kQkv});
  ops.push_back({OpKind::kMlaQkv, Act::kMlaA, Act::kQkvRaw, Param::kMla});
  ops.push_back({OpKind::kRope, Act::kQkvRaw, Act::kQkv});
  ops.push_back({OpKind::kAttention, Act::kQkv, Act::kAttn});
  ops.push_back({OpKind::kMlaOut, Act::kAttn, Act::kAttnV, Param::kMla});
  ops.push_back({OpKind::kLinear, Act::kAttnV, Act::kProj, Param::kO});
  ops.push_back({OpKind::kTpExit, Act::kProj, Act::kProj});
  ops.push_back({OpKind::kResidual, Act::kProj, Act::kH});
}

// norm → attention → (Gemma 3: norm) → residual.
void attention_block(const LayerWeights& l, std::vector<Op>& ops) {
  ops.push_back({OpKind::kRmsNorm, Act::kH, Act::kXn1, Param::kInputNorm, Act::kHIn});
  ops.push_back({OpKind::kTpEnter, Act::kXn1, Act::kXn1});
  ops.push_back({OpKind::kLinear, Act::kXn1, Act::kQkvRaw, Param::kQkv});
  if (!l.qkv_bias.empty())
    ops.push_back({OpKind::kBias, Act::kQkvRaw, Act::kQkvRaw, Param::kQkvBias});
  ops.push_back(
      {OpKind::kRope, Act::kQkvRaw, Act::kQkv, l.q_norm.empty() ? Param::kNone : Param::kQkNorm});
  ops.push_back({OpKind::kAttention, Act::kQkv, Act::kAttn});
  const bool out_norm = !l.attn_out_norm.empty();
  const Act o = out_norm ? Act::kAttnOut : Act::kProj;
  ops.push_back({OpKind::kLinear, Act::kAttn, o, Param::kO});
  ops.push_back({OpKind::kTpExit, o, o});
  if (!l.o_bias.empty()) ops.push_back({OpKind::kBias, o, o, Param::kOBias});
  if (out_norm) ops.push_back({OpKind::kRmsNorm, o, Act::kProj, Param::kAttnOutNorm});
  ops.push_back({OpKind::kResidual, Act::kProj, Act::kH});
}

// norm → gated MLP (or the MoE block) → (Gemma 3: norm) → residual.
void mlp_block(const ModelConfig& c, const LayerWeights& l, std::vector<Op>& ops) {
  ops.push_back({OpKind::kRmsNorm, Act::kH, Act::kXn2, Param::kPostNorm, Act::kHMid});
  if (l.moe) {
    ops.push_back({OpKind::kMoe, Act::kXn2, Act::kProj, Param::kMoe});
  } else {
    ops.push_back({OpKind::kTpEnter, Act::kXn2, Act::kXn2});
    ops.push_back({OpKind::kLinear, Act::kXn2, Act::kGateUp, Param::kGateUp});
    if (!l.gate_up_bias.empty())
      ops.push_back({OpKind::kBias, Act::kGateUp, Act::kGateUp, Param::kGateUpBias});
    const bool gelu = c.activation == Activation::kGeluTanh;
    ops.push_back({gelu ? OpKind::kGeGlu : OpKind::kSwiGlu, Act::kGateUp, Act::kAct});
    const Act o = l.mlp_out_norm.empty() ? Act::kProj : Act::kMlpOut;
    ops.push_back({OpKind::kLinear, Act::kAct, o, Param::kDown});
    ops.push_back({OpKind::kTpExit, o, o});
    if (!l.down_bias.empty()) ops.push_back({OpKind::kBias, o, o, Param::kDownBias});
    if (o == Act::kMlpOut) ops.push_back({OpKind::kRmsNorm, o, Act::kProj, Param::kMlpOutNorm});
  }
  ops.push_back({OpKind::kResidual, Act::kProj, Act::kH});
}

}  // namespace

LayerProgram describe_layer(const ModelConfig& config, int64_t layer, const LayerWeights& weights) {
  LayerProgram p;
  p.window = config.attention_window(layer);
  p.local_rope = config.uses_local_rope(layer);
  if (config.is_mla()) {
    mla_block(p.ops);
  } else {
    attention_block(weights, p.ops);
  }
  mlp_block(config, weights, p.ops);
  if (weights.moe) {
    p.moe_index = 0;
    for (int64_t l = 0; l < layer; ++l) p.moe_index += config.is_moe_layer(l) ? 1 : 0;
  }
  for (const Op& op : p.ops) {
    const Act a = read_by_backward(op);
    if (a != Act::kCount) p.kept[static_cast<int>(a)] = true;
  }
  return p;
}

int64_t act_width(const ModelConfig& c, Act a) {
  switch (a) {
    case Act::kH:
    case Act::kHIn:
    case Act::kHMid:
    case Act::kXn1:
    case Act::kXn2:
    case Act::kProj:
    case Act::kAttnOut:
    case Act::kMlpOut:
      return c.hidden_size;
    case Act::kQkvRaw:
    case Act::kQkv:
      return c.q_dim() + 2 * c.kv_dim();
    case Act::kAttn:
      return c.q_dim();
    case Act::kGateUp:
      return 2 * c.intermediate_size;
    case Act::kAct:
      return c.intermediate_size;
    case Act::kMlaA:
      return c.is_mla() ? mla_a_width(c) : 0;
    case Act::kAttnV:
      return c.is_mla() ? mla_out_width(c) : 0;
    case Act::kCount:
      break;
  }
  return 0;
}

Act scratch_home(Act a) {
  switch (a) {
    case Act::kHIn:
    case Act::kHMid:
      return Act::kH;
    case Act::kXn2:
      return Act::kXn1;
    case Act::kQkv:
      return Act::kQkvRaw;
    case Act::kMlpOut:
      return Act::kAttnOut;
    default:
      return a;
  }
}

Act grad_home(Act a) {
  switch (a) {
    case Act::kH:
    case Act::kProj:
      return Act::kH;
    case Act::kXn1:
    case Act::kXn2:
    case Act::kAttnOut:  // written by its norm's backward, read by the projection's before the
    case Act::kMlpOut:   // norm inputs' gradients are written
      return Act::kXn1;
    case Act::kAttn:
    case Act::kAct:
      return Act::kAttn;
    case Act::kMlaA:  // live with d qkv_raw (MLA's q/k/v backward) and d attn (its out's)
    case Act::kAttnV:
      return a;
    default:
      return Act::kQkvRaw;
  }
}

std::vector<std::pair<std::string, int64_t>> param_parts(const ModelConfig& c, int64_t layer,
                                                         Param p) {
  const std::string l = "model.layers." + std::to_string(layer) + ".";
  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), f = c.intermediate_size;
  switch (p) {
    case Param::kInputNorm:
      return {{l + "input_layernorm.weight", d}};
    case Param::kQkv:
      if (c.is_mla()) return mla_a_parts(c, l);
      return {{l + "self_attn.q_proj.weight", qd},
              {l + "self_attn.k_proj.weight", kvd},
              {l + "self_attn.v_proj.weight", kvd}};
    case Param::kQkvBias:
      return {{l + "self_attn.q_proj.bias", qd},
              {l + "self_attn.k_proj.bias", kvd},
              {l + "self_attn.v_proj.bias", kvd}};
    case Param::kQkNorm:
      return {{l + "self_attn.q_norm.weight", c.head_dim},
              {l + "self_attn.k_norm.weight", c.head_dim}};
    case Param::kO:
      return {{l + "self_attn.o_proj.weight", d}};
    case Param::kOBias:
      return {{l + "self_attn.o_proj.bias", d}};
    case Param::kPostNorm:
      return {{l + (c.has_block_output_norms() ? "pre_feedforward_layernorm.weight"
                                               : "post_attention_layernorm.weight"),
               d}};
    case Param::kAttnOutNorm:
      return {{l + "post_attention_layernorm.weight", d}};
    case Param::kMlpOutNorm:
      return {{l + "post_feedforward_layernorm.weight", d}};
    case Param::kGateUp:
      return {{l + "mlp.gate_proj.weight", f}, {l + "mlp.up_proj.weight", f}};
    case Param::kDown:
      return {{l + "mlp.down_proj.weight", d}};
    case Param::kGateUpBias:
      return {{l + "mlp.gate_proj.bias", f}, {l + "mlp.up_proj.bias", f}};
    case Param::kDownBias:
      return {{l + "mlp.down_proj.bias", d}};
    case Param::kMoe:
    case Param::kMla:
    case Param::kNone:
      break;
  }
  return {};
}

std::string check_program(const LayerProgram& program) {
  std::array<int, kNumActs> readers{};  // of each activation's current value
  for (const Op& op : program.ops) {
    const std::string at =
        std::string(op_name(op.kind)) + " (" + act_name(op.in) + " → " + act_name(op.out) + "): ";
    if (in_place_kind(op.kind) != (op.in == op.out))
      return at + "in place exactly when it is a bias or a tp mark";
    if (op.kind == OpKind::kResidual && op.out != Act::kH)
      return at + "a residual add writes the stream";
    if (op.in == Act::kH && op.kind != OpKind::kRmsNorm)
      return at +
             "the stream is read by its norms (which accumulate its gradient) and nothing else";
    if (op.kind == OpKind::kRmsNorm && (op.in == Act::kH) != (op.keep != Act::kCount))
      return at + "a norm of the stream, and only one, names where its input is kept";
    if (op.in == op.out) continue;
    if (++readers[static_cast<int>(op.in)] > 1 && op.in != Act::kH)
      return at + std::string(act_name(op.in)) + " has a second reader";
    readers[static_cast<int>(op.out)] = 0;  // a new value (kProj: each block's output)
  }
  return "";
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kRmsNorm:
      return "rmsnorm";
    case OpKind::kLinear:
      return "linear";
    case OpKind::kBias:
      return "bias";
    case OpKind::kRope:
      return "rope";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kSwiGlu:
      return "swiglu";
    case OpKind::kGeGlu:
      return "geglu";
    case OpKind::kMoe:
      return "moe";
    case OpKind::kResidual:
      return "residual";
    case OpKind::kTpEnter:
      return "tp_enter";
    case OpKind::kTpExit:
      return "tp_exit";
    case OpKind::kMlaQkv:
      return "mla_qkv";
    case OpKind::kMlaOut:
      return "mla_out";
  }
  return "?";
}

const char* act_name(Act a) {
  static constexpr const char* kNames[] = {"h",    "h_in",     "xn1",     "qkv_raw", "qkv",
                                           "attn", "proj",     "h_mid",   "xn2",     "gate_up",
                                           "act",  "attn_out", "mlp_out", "mla_a",   "attn_v"};
  return a == Act::kCount ? "-" : kNames[static_cast<int>(a)];
}

}  // namespace miles
