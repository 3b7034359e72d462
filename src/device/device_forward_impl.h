// BackendModel's forward passes: run_forward (a packed batch over a KV pool: the engine's, or a
// training forward's own, then with its activations kept on the device) and forward_train.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "device/device_model_impl.h"

namespace miles::device {

template <class B>
Result<ForwardOutput> BackendModel<B>::run_forward(const DeviceBatch& batch, Kv& kv, DevTape* tape,
                                                   const int32_t* d_forced) {
  const ModelConfig& c = config_;
  const int64_t t = static_cast<int64_t>(batch.tokens.size()), d = c.hidden_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim, ld = qd + 2 * kvd;
  const int64_t f = c.intermediate_size, bt = kv.block_tokens;
  MILES_CHECK(batch.tables.size() == batch.seqs.size());
  if (t == 0) return Status::Error("device forward: an empty batch");

  // Host side: per token its position, the block its key and value go to, its sequence's table;
  // the rows whose logits are asked for; RoPE's cos and sin as the CPU kernel computes them.
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
    for (int64_t j = 0; j < q.n_tokens; ++j, ++i) {
      const int64_t pos = q.start_pos + j;
      positions.push_back(static_cast<int32_t>(pos));
      block_of.push_back(table[pos / bt]);
      table_of.push_back(offset);
      if (batch.all_logits || j == q.n_tokens - 1) rows.push_back(static_cast<int32_t>(i));
    }
  }
  MILES_CHECK(i == t, "the sequences cover every token of the batch");
  const int64_t half = rope_.rotary_dim / 2;
  // [cos T×half][sin T×half][−sin T×half] (the last for a training forward's backward)
  std::vector<float> cs(static_cast<size_t>(3 * t * std::max<int64_t>(half, 1)));
  for (int64_t r = 0; r < t; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t j = 0; j < half; ++j) {
      const float angle = pos * rope_.inv_freq[j];
      cs[r * half + j] = std::cos(angle) * rope_.attention_scaling;
      cs[(t + r) * half + j] = std::sin(angle) * rope_.attention_scaling;
      cs[(2 * t + r) * half + j] = -(std::sin(angle) * rope_.attention_scaling);
    }
  }
  const int64_t nr = static_cast<int64_t>(rows.size());
  std::vector<int32_t> ints;
  ints.reserve(static_cast<size_t>(5 * t + nr) + tables.size());
  ints.insert(ints.end(), batch.tokens.begin(), batch.tokens.end());
  for (const auto* v : {&positions, &block_of, &table_of, &rows, &tables})
    ints.insert(ints.end(), v->begin(), v->end());

  MILES_ASSIGN_OR_RETURN(int32_t * di, scratch(ints_, static_cast<int64_t>(ints.size())));
  MILES_ASSIGN_OR_RETURN(float* dcs, scratch(rope_cs_, static_cast<int64_t>(cs.size())));
  MILES_ASSIGN_OR_RETURN(float* h, scratch(h_, t * d));
  MILES_ASSIGN_OR_RETURN(float* xn, scratch(xn_, t * d));
  MILES_ASSIGN_OR_RETURN(float* qkv, scratch(qkv_, t * ld));
  MILES_ASSIGN_OR_RETURN(float* attn, scratch(attn_, t * qd));
  MILES_ASSIGN_OR_RETURN(float* proj, scratch(proj_, t * d));
  MILES_ASSIGN_OR_RETURN(float* gu, scratch(gate_up_, t * 2 * f));
  MILES_ASSIGN_OR_RETURN(float* act, scratch(act_, t * f));
  MILES_ASSIGN_OR_RETURN(float* sel, scratch(sel_, nr * d));
  MILES_ASSIGN_OR_RETURN(float* logits, scratch(logits_, nr * c.vocab_size));
  MILES_RETURN_IF_ERROR(b_->upload(di, ints.data(), sizeof(int32_t) * ints.size()));
  MILES_RETURN_IF_ERROR(b_->upload(dcs, cs.data(), sizeof(float) * cs.size()));
  const int32_t* d_tokens = di;
  const int32_t* d_pos = di + t;
  const int32_t* d_block_of = di + 2 * t;
  const int32_t* d_table_of = di + 3 * t;
  const int32_t* d_rows = di + 4 * t;
  const int32_t* d_tables = di + 4 * t + nr;
  if (tape) {
    // Every layer's activations, then h_final and normed: one buffer.
    const int64_t per_layer = t * (4 * d + 2 * ld + qd + 3 * f);
    const int64_t fm = c.moe.moe_intermediate_size, km = c.moe.top_k;
    const int64_t per_moe = t * (c.moe.num_experts + 2 * km + km * (3 * fm + d));
    MILES_ASSIGN_OR_RETURN(
        float* tb,
        scratch(tape_buf_, c.num_layers * per_layer + c.num_moe_layers() * per_moe + 2 * t * d));
    tape->t = t;
    tape->layers.resize(static_cast<size_t>(c.num_layers));
    for (size_t li = 0; li < tape->layers.size(); ++li) {
      DevTapeLayer& l = tape->layers[li];
      if (layers_[li].moe) {
        l.probs = tb;
        l.moe_ids = reinterpret_cast<int32_t*>(tb + t * c.moe.num_experts);
        l.moe_weights = tb + t * c.moe.num_experts + t * km;
        l.moe_gate_up = l.moe_weights + t * km;
        l.moe_act = l.moe_gate_up + t * km * 2 * fm;
        l.moe_y = l.moe_act + t * km * fm;
        tb = l.moe_y + t * km * d;
      }
      for (float** p : {&l.h_in, &l.xn1, &l.h_mid, &l.xn2}) {
        *p = tb;
        tb += t * d;
      }
      l.qkv_raw = tb;
      l.qkv = tb + t * ld;
      l.attn = tb + 2 * t * ld;
      l.gate_up = l.attn + t * qd;
      l.act = l.gate_up + 2 * t * f;
      tb = l.act + t * f;
    }
    tape->h_final = tb;
    tape->normed = tb + t * d;
    tape->d_tokens = d_tokens;
    tape->d_cos = dcs;
    tape->d_neg_sin = dcs + 2 * t * half;
  }

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Routed experts of every token and MoE layer ([T, moe_layers, k] ids, then the weights).
  const int64_t n_moe = c.num_moe_layers(), topk = c.moe.top_k;
  int64_t moe_index = 0;
  float* d_record = nullptr;
  if (n_moe > 0 && batch.return_experts) {
    MILES_ASSIGN_OR_RETURN(d_record, scratch(record_, 2 * t * n_moe * topk));
  }
  b_->launch(t * d, EmbedKernel{embed_, d_tokens, d, h});
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const DevLayer& l = layers_[layer];
    DevTapeLayer* tl = tape ? &tape->layers[layer] : nullptr;
    float* k_layer = kv.k + layer * kv.num_blocks * kv.block_floats;
    float* v_layer = kv.v + layer * kv.num_blocks * kv.block_floats;
    // Attention block.
    if (tl) copy(tl->h_in, h, t * d);
    b_->launch(t, RmsnormKernel{h, d, l.input_norm, d, eps, xn, d});
    gemm(xn, t, d, l.qkv, qkv, ld);
    if (l.qkv_bias) b_->launch(t * ld, AddBiasKernel{qkv, ld, ld, l.qkv_bias});
    if (tl) {
      copy(tl->xn1, xn, t * d);
      copy(tl->qkv_raw, qkv, t * ld);
    }
    b_->launch(t * (c.num_heads + c.num_kv_heads),
               QkNormRopeKernel{qkv, ld, c.num_heads, c.num_kv_heads, hd, half, l.q_norm, l.k_norm,
                                eps, dcs, dcs + t * half});
    if (tl) copy(tl->qkv, qkv, t * ld);
    b_->launch(t * kvd,
               KvStoreKernel{qkv, ld, qd, kvd, hd, bt, d_pos, d_block_of, k_layer, v_layer});
    b_->launch(t * c.num_heads,
               AttentionKernel{qkv, ld, c.num_heads, c.num_kv_heads, hd, bt, kvd, d_pos, d_table_of,
                               d_tables, k_layer, v_layer, scale, attn, qd});
    if (tl) copy(tl->attn, attn, t * qd);
    gemm(attn, t, qd, l.o, proj, d);
    if (l.o_bias) b_->launch(t * d, AddBiasKernel{proj, d, d, l.o_bias});
    b_->launch(t * d, AddKernel{h, proj});
    // MLP block (or the MoE block, inference only).
    b_->launch(t, RmsnormKernel{h, d, l.post_norm, d, eps, xn, d});
    if (l.moe) {
      if (tl) {
        copy(tl->h_mid, h, t * d);
        copy(tl->xn2, xn, t * d);
      }
      MILES_RETURN_IF_ERROR(moe_block(
          l, xn, t, moe_index++, batch.return_experts ? d_record : nullptr, d_forced, tl, proj));
      b_->launch(t * d, AddKernel{h, proj});
      continue;
    }
    gemm(xn, t, d, l.gate_up, gu, 2 * f);
    b_->launch(t * f, SwigluKernel{gu, f, act});
    if (tl) {
      copy(tl->h_mid, h, t * d);
      copy(tl->xn2, xn, t * d);
      copy(tl->gate_up, gu, t * 2 * f);
      copy(tl->act, act, t * f);
    }
    gemm(act, t, f, l.down, proj, d);
    b_->launch(t * d, AddKernel{h, proj});
  }
  b_->launch(nr * d, GatherRowsKernel{h, d_rows, d, sel});
  if (tape) copy(tape->h_final, sel, nr * d);
  b_->launch(nr, RmsnormKernel{sel, d, final_norm_, d, eps, sel, d});
  if (tape) copy(tape->normed, sel, nr * d);
  gemm(sel, nr, d, lm_head_, logits, c.vocab_size);

  ForwardOutput out;
  out.rows = nr;
  out.vocab = c.vocab_size;
  if (d_record) {
    const int64_t n = t * n_moe * topk;
    out.experts.resize(static_cast<size_t>(n));
    out.expert_weights.resize(static_cast<size_t>(n));
    MILES_RETURN_IF_ERROR(b_->download(out.experts.data(), d_record, sizeof(int32_t) * n));
    MILES_RETURN_IF_ERROR(b_->download(out.expert_weights.data(), d_record + n, sizeof(float) * n));
  }
  out.logits.resize(static_cast<size_t>(nr * c.vocab_size));
  MILES_RETURN_IF_ERROR(b_->download(out.logits.data(), logits, sizeof(float) * out.logits.size()));
  MILES_RETURN_IF_ERROR(b_->sync());
  return out;
}

// Whole sequences from position 0 into blocks of a KV pool of its own (grown to the batch), every
// token's logits; with keep_tape the activations stay on the device for backward().
template <class B>
Result<ForwardOutput> BackendModel<B>::forward_train(std::span<const int32_t> tokens,
                                                     std::span<const SeqSpan> seqs, bool keep_tape,
                                                     std::span<const int32_t> forced) {
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
  DeviceBatch batch{tokens, seqs, {}, true, config_.num_moe_layers() > 0};
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
