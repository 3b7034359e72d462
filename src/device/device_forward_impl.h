// BackendModel's forward passes: run_forward (a packed batch over a KV pool: the engine's, or a
// training forward's own, then with its activations kept on the device) and forward_train.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "device/device_model_impl.h"

namespace miles::device {

// What the layers of one forward share: the batch's tables on the device, the KV pool, the
// routing record, where each activation lives.
template <class B>
struct BackendModel<B>::LayerRun {
  int64_t t;
  Kv& kv;
  int64_t layer = 0;
  DevTapeLayer* tape = nullptr;         // this layer's kept activations (a training forward)
  float* h = nullptr;                   // the residual stream
  std::array<float*, kNumActs> home{};  // scratch of the activations nothing keeps
  const int32_t *pos = nullptr, *block_of = nullptr, *table_of = nullptr, *tables = nullptr;
  const float *cos = nullptr, *sin = nullptr;  // RoPE's tables per token
  const float *cos_local = nullptr, *sin_local = nullptr;  // rope_local_'s (Gemma 3)
  float* record = nullptr;                     // routed experts out, or null
  const int32_t* forced = nullptr;             // replayed experts, or null
};

// One op of a layer program (layer_program.h) as device functors, each the CPU op's bits.
template <class B>
Status BackendModel<B>::forward_op(const Op& op, LayerRun& r) {
  const ModelConfig& c = config_;
  const DevLayer& l = layers_[r.layer];
  const LayerProgram& program = programs_[r.layer];
  const int64_t t = r.t;
  const float eps = static_cast<float>(c.rms_norm_eps);
  auto act = [&](Act a) -> float* {
    if (r.tape && program.keeps(a)) return (*r.tape)[a];
    const Act home = scratch_home(a);
    return home == Act::kH ? r.h : r.home[static_cast<int>(home)];
  };
  auto width = [&](Act a) { return act_width(c, a); };
  switch (op.kind) {
    case OpKind::kRmsNorm: {
      const int64_t d = width(op.in);
      if (r.tape && op.keep != Act::kCount) copy(act(op.keep), act(op.in), t * d);
      b_->launch(t, RmsnormKernel{act(op.in), d, norm_of(l, op.param), d, eps, act(op.out), d});
      return Status::Ok();
    }
    case OpKind::kLinear:
      gemm(act(op.in), t, width(op.in), matrix(l, op.param), act(op.out), width(op.out));
      return Status::Ok();
    case OpKind::kBias: {
      const int64_t n = width(op.out);
      b_->launch(t * n, AddBiasKernel{act(op.out), n, n, bias(l, op.param)});
      return Status::Ok();
    }
    case OpKind::kRope: {
      const int64_t ld = width(op.out), half = rope_.rotary_dim / 2;
      float* qkv = act(op.out);
      if (qkv != act(op.in)) copy(qkv, act(op.in), t * ld);
      const bool norms = op.param == Param::kQkNorm;
      const bool local = program.local_rope;
      b_->launch(t * (c.num_heads + c.num_kv_heads),
                 QkNormRopeKernel{qkv, ld, c.num_heads, c.num_kv_heads, c.head_dim, half,
                                  norms ? l.q_norm : nullptr, norms ? l.k_norm : nullptr, eps,
                                  local ? r.cos_local : r.cos, local ? r.sin_local : r.sin});
      return Status::Ok();
    }
    case OpKind::kAttention: {
      const int64_t qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim, ld = width(op.in);
      const int64_t bt = r.kv.block_tokens;
      float* k_layer = r.kv.k + r.layer * r.kv.num_blocks * r.kv.block_floats;
      float* v_layer = r.kv.v + r.layer * r.kv.num_blocks * r.kv.block_floats;
      const float scale = c.attention_scale();
      b_->launch(t * kvd, KvStoreKernel{act(op.in), ld, qd, kvd, hd, bt, r.pos, r.block_of, k_layer,
                                        v_layer});
      b_->launch(t * c.num_heads, AttentionKernel{act(op.in), ld, c.num_heads, c.num_kv_heads, hd,
                                                  bt, kvd, r.pos, r.table_of, r.tables, k_layer,
                                                  v_layer, scale, act(op.out), qd, program.window});
      return Status::Ok();
    }
    case OpKind::kSwiGlu: {
      const int64_t f = width(op.out);
      b_->launch(t * f, SwigluKernel{act(op.in), f, act(op.out)});
      return Status::Ok();
    }
    case OpKind::kGeGlu: {
      const int64_t f = width(op.out);
      b_->launch(t * f, GegluKernel{act(op.in), f, act(op.out)});
      return Status::Ok();
    }
    case OpKind::kMoe:
      return moe_block(l, act(op.in), t, program.moe_index, r.record, r.forced, r.tape,
                       act(op.out));
    case OpKind::kResidual:
      b_->launch(t * width(op.out), AddKernel{act(op.out), act(op.in)});
      return Status::Ok();
    case OpKind::kTpEnter:
    case OpKind::kTpExit:  // one rank holds the whole model (device_supports)
      return Status::Ok();
    case OpKind::kMlaQkv:
      return mla_qkv(l, act(op.in), t, act(op.out));
    case OpKind::kMlaOut:
      mla_out(l, act(op.in), t, act(op.out));
      return Status::Ok();
  }
  return Status::Ok();
}

// Host side of a batch: per token its position, the block its key and value go to, its sequence's
// table; the rows whose logits are asked for; RoPE's cos and sin as the CPU kernel computes them.
// `ints` is what the device gets: tokens, positions, block_of, table_of, rows, then the tables.
template <class B>
struct BackendModel<B>::HostBatch {
  std::vector<int32_t> ints;
  // [cos T×half][sin T×half][−sin T×half] (the last for the backward), then the same from
  // rope_local_ when the model has one.
  std::vector<float> cs;
  int64_t t = 0, rows = 0;
};

template <class B>
Result<typename BackendModel<B>::HostBatch> BackendModel<B>::host_batch(const DeviceBatch& batch,
                                                                        const Kv& kv) const {
  const int64_t bt = kv.block_tokens;
  MILES_RETURN_IF_ERROR(check_last_rows(batch.seqs, batch.last_rows));
  const int64_t tokens = static_cast<int64_t>(batch.tokens.size());
  for (size_t k = 0; k < batch.logit_rows.size(); ++k)
    if (batch.logit_rows[k] < 0 || batch.logit_rows[k] >= tokens ||
        (k > 0 && batch.logit_rows[k] <= batch.logit_rows[k - 1]))
      return Status::Error("device forward: logit_rows: row " +
                           std::to_string(batch.logit_rows[k]) + " at index " + std::to_string(k) +
                           " is not ascending inside the batch's " + std::to_string(tokens) +
                           " tokens");
  std::vector<int32_t> positions, block_of, table_of, rows, tables;
  int64_t i = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqSpan& q = batch.seqs[s];
    const std::span<const int32_t> table = batch.tables[s];
    if (static_cast<int64_t>(table.size()) * bt < q.start_pos + q.n_tokens)
      return Status::Error("device forward: sequence " + std::to_string(s) + " reaches position " +
                           std::to_string(q.start_pos + q.n_tokens - 1) + " but its table has " +
                           std::to_string(table.size()) + " blocks");
    for (const int32_t b : table)
      if (b < 0 || b >= kv.num_blocks)
        return Status::Error("device forward: block id " + std::to_string(b) +
                             " is outside the device pool of " + std::to_string(kv.num_blocks) +
                             " blocks");
    const int32_t offset = static_cast<int32_t>(tables.size());
    tables.insert(tables.end(), table.begin(), table.end());
    const int64_t last = batch.last_rows.empty() ? 1 : batch.last_rows[s];
    for (int64_t j = 0; j < q.n_tokens; ++j, ++i) {
      const int64_t pos = q.start_pos + j;
      positions.push_back(static_cast<int32_t>(pos));
      block_of.push_back(table[pos / bt]);
      table_of.push_back(offset);
      if (batch.logit_rows.empty() && (batch.all_logits || j >= q.n_tokens - last))
        rows.push_back(static_cast<int32_t>(i));
    }
  }
  for (const int64_t r : batch.logit_rows) rows.push_back(static_cast<int32_t>(r));
  const int64_t t = static_cast<int64_t>(batch.tokens.size());
  MILES_CHECK(i == t, "the sequences cover every token of the batch");
  HostBatch h;
  h.t = t;
  h.rows = static_cast<int64_t>(rows.size());
  const int64_t half = rope_.rotary_dim / 2, per_table = 3 * t * std::max<int64_t>(half, 1);
  const bool local = !rope_local_.inv_freq.empty();
  h.cs.resize(static_cast<size_t>((local ? 2 : 1) * per_table));
  auto fill = [&](const kernels::RopeTable& rope, float* cs) {
    for (int64_t r = 0; r < t; ++r) {
      const float pos = static_cast<float>(positions[r]);
      for (int64_t j = 0; j < half; ++j) {
        const float angle = pos * rope.inv_freq[j];
        cs[r * half + j] = std::cos(angle) * rope.attention_scaling;
        cs[(t + r) * half + j] = std::sin(angle) * rope.attention_scaling;
        cs[(2 * t + r) * half + j] = -(std::sin(angle) * rope.attention_scaling);
      }
    }
  };
  fill(rope_, h.cs.data());
  if (local) fill(rope_local_, h.cs.data() + per_table);
  h.ints.reserve(static_cast<size_t>(5 * t + h.rows) + tables.size());
  h.ints.insert(h.ints.end(), batch.tokens.begin(), batch.tokens.end());
  for (const auto* v : {&positions, &block_of, &table_of, &rows, &tables})
    h.ints.insert(h.ints.end(), v->begin(), v->end());
  return h;
}

// A training forward's tape: every layer's kept activations (LayerProgram::keeps) and MoE
// records, then h_final and normed, in one buffer.
template <class B>
Status BackendModel<B>::lay_out_tape(DevTape& tape, int64_t t) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, fm = c.moe.moe_intermediate_size, km = c.moe.top_k;
  const int64_t fs = c.moe.n_shared_experts * fm;  // the shared expert's width (0: none)
  const int64_t per_moe = t * (c.moe.num_experts + 2 * km + km * (3 * fm + d) + 3 * fs);
  int64_t floats = c.num_moe_layers() * per_moe + 2 * t * d;
  for (const LayerProgram& p : programs_)
    for (int a = 0; a < kNumActs; ++a)
      if (p.kept[a]) floats += t * act_width(c, static_cast<Act>(a));
  MILES_ASSIGN_OR_RETURN(float* tb, scratch(tape_buf_, floats));
  tape.t = t;
  tape.layers.assign(static_cast<size_t>(c.num_layers), DevTapeLayer{});
  for (size_t li = 0; li < tape.layers.size(); ++li) {
    DevTapeLayer& l = tape.layers[li];
    if (layers_[li].moe) {
      l.probs = tb;
      l.moe_ids = reinterpret_cast<int32_t*>(tb + t * c.moe.num_experts);
      l.moe_weights = tb + t * c.moe.num_experts + t * km;
      l.moe_gate_up = l.moe_weights + t * km;
      l.moe_act = l.moe_gate_up + t * km * 2 * fm;
      l.moe_y = l.moe_act + t * km * fm;
      tb = l.moe_y + t * km * d;
      if (layers_[li].shared) {
        l.shared_gate_up = tb;
        l.shared_act = tb + t * 2 * fs;
        tb = l.shared_act + t * fs;
      }
    }
    for (int a = 0; a < kNumActs; ++a) {
      if (!programs_[li].kept[a]) continue;
      l.acts[a] = tb;
      tb += t * act_width(c, static_cast<Act>(a));
    }
  }
  tape.h_final = tb;
  tape.normed = tb + t * d;
  return Status::Ok();
}

// embed → every layer's program → final norm and LM head over the rows asked for.
template <class B>
Result<ForwardOutput> BackendModel<B>::run_forward(const DeviceBatch& batch, Kv& kv, DevTape* tape,
                                                   const int32_t* d_forced) {
  const ModelConfig& c = config_;
  const int64_t t = static_cast<int64_t>(batch.tokens.size()), d = c.hidden_size;
  MILES_CHECK(batch.tables.size() == batch.seqs.size());
  if (t == 0) return Status::Error("device forward: an empty batch");
  MILES_ASSIGN_OR_RETURN(const HostBatch hb, host_batch(batch, kv));
  const int64_t nr = hb.rows, half = rope_.rotary_dim / 2;

  MILES_ASSIGN_OR_RETURN(int32_t * di, scratch(ints_, static_cast<int64_t>(hb.ints.size())));
  MILES_ASSIGN_OR_RETURN(float* dcs, scratch(rope_cs_, static_cast<int64_t>(hb.cs.size())));
  MILES_ASSIGN_OR_RETURN(float* h, scratch(h_, t * d));
  LayerRun run{t, kv};
  run.h = h;
  for (int a = 0; a < kNumActs; ++a) {
    const Act act = static_cast<Act>(a);
    if (scratch_home(act) != act || act == Act::kH) continue;
    MILES_ASSIGN_OR_RETURN(run.home[a], scratch(acts_[a], t * act_width(c, act)));
  }
  MILES_ASSIGN_OR_RETURN(float* sel, scratch(sel_, nr * d));
  MILES_ASSIGN_OR_RETURN(float* logits, scratch(logits_, nr * c.vocab_size));
  MILES_RETURN_IF_ERROR(b_->upload(di, hb.ints.data(), sizeof(int32_t) * hb.ints.size()));
  MILES_RETURN_IF_ERROR(b_->upload(dcs, hb.cs.data(), sizeof(float) * hb.cs.size()));
  const int32_t* d_tokens = di;
  const int32_t* d_rows = di + 4 * t;
  run.pos = di + t;
  run.block_of = di + 2 * t;
  run.table_of = di + 3 * t;
  run.tables = di + 4 * t + nr;
  run.cos = dcs;
  run.sin = dcs + t * half;
  const float* lcs = dcs + 3 * t * std::max<int64_t>(half, 1);  // rope_local_'s, when it has one
  run.cos_local = lcs;
  run.sin_local = lcs + t * half;
  if (tape) {
    MILES_RETURN_IF_ERROR(lay_out_tape(*tape, t));
    tape->d_tokens = d_tokens;
    tape->rows = nr;
    tape->d_rows = d_rows;
    tape->d_cos = dcs;
    tape->d_neg_sin = dcs + 2 * t * half;
    tape->d_cos_local = lcs;
    tape->d_neg_sin_local = lcs + 2 * t * half;
  }
  // Routed experts of every token and MoE layer ([T, moe_layers, k] ids, then the weights).
  const int64_t n_moe = c.num_moe_layers(), topk = c.moe.top_k;
  if (n_moe > 0 && batch.return_experts) {
    MILES_ASSIGN_OR_RETURN(run.record, scratch(record_, 2 * t * n_moe * topk));
  }
  run.forced = d_forced;

  b_->launch(t * d, EmbedKernel{embed_, d_tokens, d, h});
  const std::span<const int64_t> taps = batch.tap_layers;
  MILES_RETURN_IF_ERROR(check_tap_layers(taps, 0, c.num_layers));
  std::vector<float> tapped(static_cast<size_t>(t * d));
  ForwardOutput out;
  out.taps.resize(static_cast<size_t>(t * d) * taps.size());
  for (int64_t layer = 0, tap = 0; layer < c.num_layers; ++layer) {
    run.layer = layer;
    run.tape = tape ? &tape->layers[layer] : nullptr;
    for (const Op& op : programs_[layer].ops) MILES_RETURN_IF_ERROR(forward_op(op, run));
    if (tap < static_cast<int64_t>(taps.size()) && taps[tap] == layer) {  // ForwardOutput::taps
      MILES_RETURN_IF_ERROR(b_->download(tapped.data(), h, sizeof(float) * tapped.size()));
      const int64_t n = taps.size();
      for (int64_t i = 0; i < t; ++i)
        std::copy_n(tapped.data() + i * d, d, out.taps.data() + (i * n + tap) * d);
      ++tap;
    }
  }
  b_->launch(nr * d, GatherRowsKernel{h, d_rows, d, sel});
  if (tape) copy(tape->h_final, sel, nr * d);
  b_->launch(nr, RmsnormKernel{sel, d, final_norm_, d, static_cast<float>(c.rms_norm_eps), sel, d});
  if (tape) copy(tape->normed, sel, nr * d);
  gemm(sel, nr, d, lm_head_, logits, c.vocab_size);

  out.rows = nr;
  out.vocab = c.vocab_size;
  if (run.record) {
    const int64_t n = t * n_moe * topk;
    out.experts.resize(static_cast<size_t>(n));
    out.expert_weights.resize(static_cast<size_t>(n));
    MILES_RETURN_IF_ERROR(b_->download(out.experts.data(), run.record, sizeof(int32_t) * n));
    MILES_RETURN_IF_ERROR(
        b_->download(out.expert_weights.data(), run.record + n, sizeof(float) * n));
  }
  if (batch.return_hidden) {
    out.hidden.resize(static_cast<size_t>(t * d));
    MILES_RETURN_IF_ERROR(b_->download(out.hidden.data(), h, sizeof(float) * out.hidden.size()));
  }
  out.logits.resize(static_cast<size_t>(nr * c.vocab_size));
  MILES_RETURN_IF_ERROR(b_->download(out.logits.data(), logits, sizeof(float) * out.logits.size()));
  MILES_RETURN_IF_ERROR(b_->sync());
  return out;
}

// Whole sequences from position 0 into blocks of a KV pool of its own (grown to the batch), every
// token's logits (or logit_rows'); with keep_tape the activations stay on the device for
// backward().
template <class B>
Result<ForwardOutput> BackendModel<B>::forward_train(std::span<const int32_t> tokens,
                                                     std::span<const SeqSpan> seqs, bool keep_tape,
                                                     std::span<const int32_t> forced,
                                                     std::span<const int64_t> logit_rows,
                                                     std::span<const int64_t> tap_layers) {
  const int64_t bt = 16;
  int64_t blocks = 0, total = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (seqs[s].start_pos != 0)
      return Status::Error("a training forward needs whole sequences; sequence " +
                           std::to_string(s) + " starts at position " +
                           std::to_string(seqs[s].start_pos));
    if (seqs[s].n_tokens > config_.max_position_embeddings)
      return Status::Error("sequence " + std::to_string(s) + " has " +
                           std::to_string(seqs[s].n_tokens) + " tokens, past the context of " +
                           std::to_string(config_.max_position_embeddings));
    blocks += (seqs[s].n_tokens + bt - 1) / bt;
    total += seqs[s].n_tokens;
  }
  if (total != static_cast<int64_t>(tokens.size()))
    return Status::Error("sequences cover " + std::to_string(total) + " tokens but the batch has " +
                         std::to_string(tokens.size()));
  for (size_t k = 0; k < tokens.size(); ++k)
    if (tokens[k] < 0 || tokens[k] >= config_.vocab_size)
      return Status::Error("token id " + std::to_string(tokens[k]) + " at batch index " +
                           std::to_string(k) + " is outside the vocabulary");
  if (!train_kv_ || train_kv_->num_blocks < blocks) {
    train_kv_.reset();
    MILES_ASSIGN_OR_RETURN(train_kv_, make_kv(b_, config_, std::max<int64_t>(blocks, 64), bt));
  }
  std::vector<std::vector<int32_t>> tables(seqs.size());
  int32_t next = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t k = 0; k < (seqs[s].n_tokens + bt - 1) / bt; ++k) tables[s].push_back(next++);
  DeviceBatch batch{tokens, seqs,       {},    true,      config_.num_moe_layers() > 0,
                    {},     logit_rows, false, tap_layers};
  for (const auto& t : tables) batch.tables.emplace_back(t);
  // Routing replay: ids checked as Model::forward checks them, then uploaded.
  const int32_t* d_forced = nullptr;
  if (!forced.empty()) {
    const int64_t k = config_.moe.top_k, per_token = config_.num_moe_layers() * k;
    if (per_token == 0 || static_cast<int64_t>(forced.size()) != total * per_token)
      return Status::Error("forced expert ids: expected " + std::to_string(total * per_token) +
                           " ids ([tokens, moe layers, top_k]), got " +
                           std::to_string(forced.size()));
    for (size_t i = 0; i < forced.size(); ++i) {
      const int32_t e = forced[i];
      if (e < 0 || e >= config_.moe.num_experts)
        return Status::Error("forced expert id " + std::to_string(e) + " at index " +
                             std::to_string(i) + " is outside [0, " +
                             std::to_string(config_.moe.num_experts) + ")");
      for (size_t j = i - i % k; j < i; ++j)
        if (forced[j] == e)
          return Status::Error("forced expert id " + std::to_string(e) +
                               " is repeated for one token (index " + std::to_string(i) + ")");
    }
    MILES_ASSIGN_OR_RETURN(int32_t * p, scratch(forced_, static_cast<int64_t>(forced.size())));
    MILES_RETURN_IF_ERROR(b_->upload(p, forced.data(), sizeof(int32_t) * forced.size()));
    d_forced = p;
  }
  tape_ = DevTape{};
  if (keep_tape) {
    tape_.tokens.assign(tokens.begin(), tokens.end());
    tape_.seqs.assign(seqs.begin(), seqs.end());
    int64_t off = 0;
    for (const SeqSpan& q : seqs) {
      tape_.offset.push_back(off);
      off += q.n_tokens;
    }
  }
  return run_forward(batch, *train_kv_, keep_tape ? &tape_ : nullptr, d_forced);
}

}  // namespace miles::device
