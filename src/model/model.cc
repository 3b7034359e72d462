// Model::forward over a packed batch: embed → (attention block, MLP or MoE block) per layer → final
// norm → LM head. Each phase works on whole rows with batch-invariant kernels.
#include "miles/model.h"

#include <array>
#include <cmath>

#include "miles/backward_kernels.h"
#include "miles/comm.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "model/backward_weights.h"
#include "model/elementwise.h"
#include "model/forward_tape.h"
#include "model/mla.h"
#include "model/model_weights.h"
#include "model/moe.h"

namespace miles {

namespace {

// Per-forward layout of the packed batch.
struct BatchPlan {
  std::vector<int32_t> positions;  // [T]
  std::vector<int32_t> seq_of;     // [T] index into seqs
  std::vector<int64_t> offset;     // [S] first token of each sequence
};

BatchPlan plan_batch(std::span<const SeqSpan> seqs, int64_t t) {
  BatchPlan p;
  p.positions.resize(t);
  p.seq_of.resize(t);
  int64_t i = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    p.offset.push_back(i);
    for (int64_t j = 0; j < seqs[s].n_tokens; ++j, ++i) {
      p.positions[i] = static_cast<int32_t>(seqs[s].start_pos + j);
      p.seq_of[i] = static_cast<int32_t>(s);
    }
  }
  return p;
}

// dst[0, n) = src[0, n), spread over the pool.
void copy_over(const float* src, int64_t n, float* dst, ThreadPool* pool) {
  parallel_ranges(pool, n, 1,
                  [&](int64_t i0, int64_t i1) { std::copy(src + i0, src + i1, dst + i0); });
}

// Tensor parallelism: the sum over the group of each rank's partial (tree order), in place.
Status tp_all_reduce(const TensorParallel* tp, float* x, int64_t n) {
  if (!tp || !tp->comm || tp->comm->size() == 1) return Status::Ok();
  return tp->comm->all_reduce_sum_deterministic(std::span<float>(x, static_cast<size_t>(n)));
}

void add_bias(float* y, int64_t rows, int64_t n, int64_t ld, const std::vector<float>& bias,
              ThreadPool* pool) {
  parallel_ranges(pool, rows, n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < n; ++j) y[r * ld + j] = y[r * ld + j] + bias[j];
  });
}

// Row-wise phases of a layer spread over the pool: each row's bits are those of the kernel on that
// row alone, so how the rows are cut never shows.
void rmsnorm_rows(const float* x, int64_t t, int64_t d, const std::vector<float>& weight,
                  double eps, float* out, ThreadPool* pool) {
  parallel_ranges(pool, t, 2 * d, [&](int64_t r0, int64_t r1) {
    kernels::rmsnorm(x + r0 * d, r1 - r0, d, weight.data(), static_cast<float>(eps), out + r0 * d);
  });
}

// What the layers of one forward share: the batch, the cache, the routing record.
struct ForwardBatch {
  std::span<const SeqSpan> seqs;
  const BatchPlan& plan;
  KvStore& kv;
  int64_t t;
  const ForwardOptions& options;
  ForwardOutput& out;
};

// The CPU backend of a layer program (layer_program.h): each op on whole rows with the
// batch-invariant kernels. An activation lives in the tape when a training forward keeps it (the
// phases write straight into its buffers, reused from the tape's last forward: no copies, no fresh
// pages), else in scratch shared by the layers.
class CpuLayers {
 public:
  CpuLayers(const ModelConfig& c, const ModelWeights& w, ForwardBatch& b, float* h,
            ThreadPool* pool)
      : c_(c), w_(w), b_(b), h_(h), pool_(pool) {}

  Status run(int64_t layer, LayerTape* tape) {
    layer_ = layer;
    tape_ = tape;
    for (const Op& op : w_.programs[layer].ops) MILES_RETURN_IF_ERROR(forward(op));
    return Status::Ok();
  }

 private:
  const LayerWeights& l() const { return w_.layers[layer_]; }
  int64_t width(Act a) const { return act_width(c_, a); }

  float* act(Act a) {
    const int64_t n = b_.t * width(a);
    if (tape_ && w_.programs[layer_].keeps(a)) return sized((*tape_)[a], n).data();
    const Act home = scratch_home(a);
    if (home == Act::kH) return h_;
    return sized(scratch_[static_cast<int>(home)], n).data();
  }

  const std::vector<float>& vec(Param p) const {
    switch (p) {
      case Param::kInputNorm:
        return l().input_norm;
      case Param::kPostNorm:
        return l().post_norm;
      case Param::kAttnOutNorm:
        return l().attn_out_norm;
      case Param::kMlpOutNorm:
        return l().mlp_out_norm;
      case Param::kQkvBias:
        return l().qkv_bias;
      case Param::kOBias:
        return l().o_bias;
      case Param::kGateUpBias:
        return l().gate_up_bias;
      case Param::kDownBias:
        return l().down_bias;
      default:
        MILES_CHECK(false, "a vector parameter");
        return l().input_norm;
    }
  }
  const kernels::PackedMatrix& matrix(Param p) const {
    switch (p) {
      case Param::kQkv:
        return l().qkv;
      case Param::kO:
        return l().o;
      case Param::kGateUp:
        return l().gate_up;
      case Param::kDown:
        return l().down;
      default:
        MILES_CHECK(false, "a matrix parameter");
        return l().qkv;
    }
  }

  Status forward(const Op& op) {
    const int64_t t = b_.t;
    switch (op.kind) {
      case OpKind::kRmsNorm:
        if (tape_ && op.keep != Act::kCount)
          copy_over(act(op.in), t * width(op.in), act(op.keep), pool_);
        rmsnorm_rows(act(op.in), t, width(op.in), vec(op.param), c_.rms_norm_eps, act(op.out),
                     pool_);
        return Status::Ok();
      case OpKind::kLinear:
        kernels::gemm(act(op.in), t, width(op.in), matrix(op.param), act(op.out), width(op.out),
                      pool_);
        return Status::Ok();
      case OpKind::kBias:
        add_bias(act(op.out), t, width(op.out), width(op.out), vec(op.param), pool_);
        return Status::Ok();
      case OpKind::kRope:
        rope(act(op.in), act(op.out), op.param == Param::kQkNorm);
        return Status::Ok();
      case OpKind::kAttention:
        attention(act(op.in), act(op.out));
        return Status::Ok();
      case OpKind::kSwiGlu:
      case OpKind::kGeGlu: {
        const int64_t f = width(op.out);
        float* gu = act(op.in);
        float* y = act(op.out);
        const auto kernel = op.kind == OpKind::kSwiGlu ? kernels::swiglu : kernels::geglu;
        parallel_ranges(pool_, t, 8 * f, [&](int64_t r0, int64_t r1) {
          kernel(gu + r0 * 2 * f, gu + r0 * 2 * f + f, r1 - r0, f, 2 * f, y + r0 * f);
        });
        return Status::Ok();
      }
      case OpKind::kMoe:
        return moe(act(op.in), act(op.out));
      case OpKind::kMlaQkv:
        mla_qkv(c_, l().mla, act(op.in), t, act(op.out), pool_);
        return Status::Ok();
      case OpKind::kMlaOut:
        mla_out(c_, l().mla, act(op.in), t, act(op.out), pool_);
        return Status::Ok();
      case OpKind::kResidual:
        add_into(act(op.out), act(op.in), t * width(op.out), pool_);
        return Status::Ok();
      case OpKind::kTpEnter:
        return Status::Ok();
      case OpKind::kTpExit:
        return tp_all_reduce(b_.options.tp, act(op.in), t * width(op.in));
    }
    return Status::Ok();
  }

  // Per token: the q/k norms (when the layer has them), then RoPE over q's heads and k's.
  void rope(const float* raw, float* qkv, bool qk_norm) {
    const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim, ld = qd + 2 * kvd;
    const kernels::RopeTable& table = w_.programs[layer_].local_rope ? w_.rope_local : w_.rope;
    parallel_ranges(pool_, b_.t, 4 * (qd + kvd), [&](int64_t i0, int64_t i1) {
      if (qkv != raw) std::copy(raw + i0 * ld, raw + i1 * ld, qkv + i0 * ld);
      for (int64_t i = i0; i < i1; ++i) {
        float* q = qkv + i * ld;
        float* k = q + qd;
        if (qk_norm) {
          const float eps = static_cast<float>(c_.rms_norm_eps);
          kernels::rmsnorm(q, c_.num_heads, hd, l().q_norm.data(), eps, q);
          kernels::rmsnorm(k, c_.num_kv_heads, hd, l().k_norm.data(), eps, k);
        }
        // q's heads then k's, side by side in the row: one rotation table lookup for both.
        kernels::rope_apply(q, 1, c_.num_heads + c_.num_kv_heads, hd, &b_.plan.positions[i], table);
      }
    });
  }

  // Keys and values into the cache, then each sequence's queries against its block list.
  void attention(const float* qkv, float* attn) {
    const int64_t qd = c_.q_dim(), kvd = c_.kv_dim(), hd = c_.head_dim, ld = qd + 2 * kvd;
    if (!b_.options.earlier_passes.empty()) return pass_attention(qkv, attn);
    const BatchPlan& plan = b_.plan;
    const int64_t bt = b_.kv.block_tokens();
    std::vector<std::vector<float*>> kb(b_.seqs.size()), vb(b_.seqs.size());
    for (size_t si = 0; si < b_.seqs.size(); ++si) {
      b_.kv.blocks(b_.seqs[si].kv_slot, layer_, kb[si], vb[si]);
      for (int64_t j = 0; j < b_.seqs[si].n_tokens; ++j) {
        const int64_t i = plan.offset[si] + j, pos = plan.positions[i];
        const float* row = qkv + i * ld + qd;
        kernels::kv_block_store(row, row + kvd, pos % bt, bt, c_.num_kv_heads, hd, kb[si][pos / bt],
                                vb[si][pos / bt]);
      }
    }
    const float scale = c_.attention_scale();
    // Work items: runs of up to kQueriesPerItem consecutive tokens of one sequence (they share each
    // key block's transposition); a token's bits do not depend on how the runs are cut.
    constexpr int64_t kQueriesPerItem = 16;
    std::vector<std::pair<int64_t, int64_t>> items;  // (first token, count)
    for (size_t si = 0; si < b_.seqs.size(); ++si)
      for (int64_t j = 0; j < b_.seqs[si].n_tokens; j += kQueriesPerItem)
        items.emplace_back(plan.offset[si] + j,
                           std::min(kQueriesPerItem, b_.seqs[si].n_tokens - j));
    // The latest queries (the most keys) first, so that the last items to finish are short ones.
    parallel_for(b_.t >= 8 ? pool_ : nullptr, static_cast<int64_t>(items.size()), [&](int64_t it) {
      const auto [i, n] = items[items.size() - 1 - it];
      const int32_t si = plan.seq_of[i];
      std::vector<const float*> kc(kb[si].begin(), kb[si].end()), vc(vb[si].begin(), vb[si].end());
      kernels::KvSpan span{kc, vc, bt};
      kernels::attention(qkv + i * ld, ld, n, c_.num_heads, c_.num_kv_heads, hd, &plan.positions[i],
                         span, scale, attn + i * qd, qd, w_.programs[layer_].window);
    });
  }

  // A training-time test pass (ForwardOptions::earlier_passes): each row over its sequence's
  // rows of the earlier passes' kept q/k/v and its own.
  void pass_attention(const float* qkv, float* attn) {
    const int64_t qd = c_.q_dim(), ld = qd + 2 * c_.kv_dim();
    const std::span<const ForwardTape* const> earlier = b_.options.earlier_passes;
    std::vector<const float*> rows(b_.seqs.size() * earlier.size());
    std::vector<kernels::PassAttentionSeq> seqs;
    for (size_t s = 0; s < b_.seqs.size(); ++s) {
      const int64_t off = b_.plan.offset[s];
      for (size_t p = 0; p < earlier.size(); ++p)
        rows[s * earlier.size() + p] =
            earlier[p]->impl().layers[layer_][Act::kQkv].data() + off * ld;
      kernels::PassAttentionSeq q{
          {rows.data() + s * earlier.size(), earlier.size()}, qkv + off * ld, b_.seqs[s].n_tokens};
      q.out = attn + off * qd;
      seqs.push_back(q);
    }
    kernels::pass_attention(seqs, ld, c_.num_heads, c_.num_kv_heads, c_.head_dim,
                            c_.attention_scale(), w_.programs[layer_].window, pool_);
  }

  // The MoE block (moe.h), its routing replayed from options.forced_experts and recorded into the
  // output's experts when asked, at the layer's place among the MoE layers.
  Status moe(const float* xn, float* out) {
    const int64_t k = c_.moe.top_k, stride = c_.num_moe_layers() * k;
    const int64_t at = w_.programs[layer_].moe_index * k;
    std::span<const int32_t> forced;
    if (!b_.options.forced_experts.empty()) forced = b_.options.forced_experts.subspan(at);
    ForwardOutput& o = b_.out;
    int32_t* ids = o.experts.empty() ? nullptr : o.experts.data() + at;
    float* wts = o.expert_weights.empty() ? nullptr : o.expert_weights.data() + at;
    return moe_block(c_, l(), xn, b_.t, forced, stride, out, ids, wts, stride,
                     tape_ ? &tape_->moe : nullptr, b_.options.tp, pool_);
  }

  const ModelConfig& c_;
  const ModelWeights& w_;
  ForwardBatch& b_;
  float* h_;
  ThreadPool* pool_;
  int64_t layer_ = 0;
  LayerTape* tape_ = nullptr;
  std::array<std::vector<float>, kNumActs> scratch_;
};

Status check_tape_batch(std::span<const SeqSpan> seqs, const ForwardOptions& options) {
  if (!options.all_logits && options.logit_rows.empty())
    return Status::Error("a training forward (tape) needs all_logits or logit_rows");
  for (size_t s = 0; s < seqs.size(); ++s)
    if (seqs[s].start_pos != 0)
      return Status::Error("a training forward (tape) needs whole sequences; sequence " +
                           std::to_string(s) + " starts at position " +
                           std::to_string(seqs[s].start_pos));
  return Status::Ok();
}

// ForwardOptions::earlier_passes against this forward: tapes of the same batch over its layers.
Status check_earlier_passes(const ModelConfig& c, int64_t t, std::span<const SeqSpan> seqs,
                            int64_t begin, int64_t end, const ForwardOptions& options) {
  if (options.earlier_passes.empty()) return Status::Ok();
  if (!options.tape) return Status::Error("earlier passes (a training-time test) need a tape");
  if (c.is_mla()) return Status::Error("earlier passes (a training-time test): MLA attention");
  for (size_t p = 0; p < options.earlier_passes.size(); ++p) {
    const ForwardTape* e = options.earlier_passes[p];
    const std::string which = "earlier pass " + std::to_string(p + 1);
    if (e == nullptr || e == options.tape) return Status::Error(which + " is not another tape");
    const ForwardTape::Impl& x = e->impl();
    bool same = static_cast<int64_t>(x.tokens.size()) == t && x.seqs.size() == seqs.size();
    for (size_t s = 0; same && s < seqs.size(); ++s)
      same = x.seqs[s].n_tokens == seqs[s].n_tokens && x.seqs[s].start_pos == seqs[s].start_pos;
    if (!same) return Status::Error(which + " ran another batch");
    if (x.layer_begin > begin || x.layer_end < end)
      return Status::Error(which + " did not run layers [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ")");
  }
  return Status::Ok();
}

}  // namespace

ForwardTape::ForwardTape() : impl_(std::make_unique<Impl>()) {}
ForwardTape::~ForwardTape() = default;

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::from_weights(const ModelConfig& config,
                                                   const TensorMap& weights) {
  MILES_RETURN_IF_ERROR(config.validate(config.arch_name));
  MILES_ASSIGN_OR_RETURN(ModelWeights w, load_model_weights(config, weights));
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->w_ = std::make_unique<ModelWeights>(std::move(w));
  return m;
}

std::unique_ptr<SimpleKvCache> Model::make_kv_cache(int64_t block_tokens) const {
  return std::make_unique<SimpleKvCache>(config_.num_layers, config_.kv_dim(), block_tokens,
                                         config_.max_position_embeddings);
}

Status check_tap_layers(std::span<const int64_t> taps, int64_t begin, int64_t end) {
  for (size_t i = 0; i < taps.size(); ++i)
    if (taps[i] < begin || taps[i] >= end || (i > 0 && taps[i] <= taps[i - 1]))
      return Status::Error("tap layers: layer " + std::to_string(taps[i]) +
                           " is not ascending inside the forward's layers [" +
                           std::to_string(begin) + ", " + std::to_string(end) + ")");
  return Status::Ok();
}

Status check_last_rows(std::span<const SeqSpan> seqs, std::span<const int64_t> last_rows) {
  if (last_rows.empty()) return Status::Ok();
  if (last_rows.size() != seqs.size())
    return Status::Error("last_rows: " + std::to_string(last_rows.size()) + " counts for " +
                         std::to_string(seqs.size()) + " sequences");
  for (size_t s = 0; s < seqs.size(); ++s)
    if (last_rows[s] < 1 || last_rows[s] > seqs[s].n_tokens)
      return Status::Error("last_rows: sequence " + std::to_string(s) + " asks for " +
                           std::to_string(last_rows[s]) + " rows of its " +
                           std::to_string(seqs[s].n_tokens) + " tokens");
  return Status::Ok();
}

namespace {

Status check_logit_rows(std::span<const int64_t> rows, int64_t tokens) {
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] < 0 || rows[i] >= tokens || (i > 0 && rows[i] <= rows[i - 1]))
      return Status::Error("logit_rows: row " + std::to_string(rows[i]) + " at index " +
                           std::to_string(i) + " is not ascending inside the batch's " +
                           std::to_string(tokens) + " tokens");
  return Status::Ok();
}

// The rows the forward starts from, into h: the tokens' embeddings (vocabulary-parallel under
// tp: this rank's rows, zeros elsewhere, summed exactly), or `input_hidden` when it is `given`
// (a forward that starts past layer 0, or is handed its input).
Status input_rows(const ModelConfig& c, const ModelWeights& w, std::span<const int32_t> tokens,
                  bool given, int64_t begin, const ForwardOptions& options, std::vector<float>& h) {
  const int64_t t = tokens.size(), d = c.hidden_size;
  if (given) {
    if (static_cast<int64_t>(options.input_hidden.size()) != t * d)
      return Status::Error("a forward starting at layer " + std::to_string(begin) +
                           " with input_hidden needs tokens × hidden = " + std::to_string(t * d) +
                           " values, got " + std::to_string(options.input_hidden.size()));
    std::copy(options.input_hidden.begin(), options.input_hidden.end(), h.begin());
    return Status::Ok();
  }
  if (!options.tp) {
    kernels::embedding(w.embed.data(), d, tokens.data(), t, h.data());
    return Status::Ok();
  }
  const int64_t vb = options.tp->vocab_begin, vl = c.vocab_size;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t id = tokens[i] - vb;
    if (id >= 0 && id < vl) std::copy_n(w.embed.data() + id * d, d, h.data() + i * d);
  }
  return tp_all_reduce(options.tp, h.data(), t * d);
}

// A tape set up for this forward (the buffers of a reused tape kept).
void start_tape(ForwardTape::Impl& tape, std::span<const int32_t> tokens,
                std::span<const SeqSpan> seqs, const BatchPlan& plan, int64_t num_layers,
                int64_t begin, int64_t end, bool embedded, const ForwardOptions& options) {
  tape.tokens.assign(tokens.begin(), tokens.end());
  tape.seqs.assign(seqs.begin(), seqs.end());
  tape.offset = plan.offset;
  tape.positions = plan.positions;
  tape.layers.resize(static_cast<size_t>(num_layers));
  tape.layer_begin = begin;
  tape.layer_end = end;
  tape.embedded = embedded;
  tape.earlier.clear();
  for (const ForwardTape* e : options.earlier_passes) tape.earlier.push_back(&e->impl());
  tape.sent_dqkv.clear();
}

// The rows the LM head runs over: logit_rows; every row (all_logits); else each sequence's last
// (or last_rows[s]) rows.
std::vector<int64_t> head_rows(const ForwardOptions& options, std::span<const SeqSpan> seqs,
                               const BatchPlan& plan, int64_t t) {
  std::vector<int64_t> rows;
  if (!options.logit_rows.empty()) {
    rows.assign(options.logit_rows.begin(), options.logit_rows.end());
  } else if (options.all_logits) {
    for (int64_t i = 0; i < t; ++i) rows.push_back(i);
  } else {
    for (size_t si = 0; si < seqs.size(); ++si) {
      const int64_t k = options.last_rows.empty() ? 1 : options.last_rows[si];
      for (int64_t j = seqs[si].n_tokens - k; j < seqs[si].n_tokens; ++j)
        rows.push_back(plan.offset[si] + j);
    }
  }
  return rows;
}

}  // namespace

Status Model::check_batch(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                          const ForwardOptions& options) const {
  MILES_RETURN_IF_ERROR(check_last_rows(seqs, options.last_rows));
  MILES_RETURN_IF_ERROR(check_logit_rows(options.logit_rows, static_cast<int64_t>(tokens.size())));
  const int64_t vocab = options.tp ? options.tp->full_vocab : config_.vocab_size;
  int64_t total = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqSpan& q = seqs[s];
    if (q.n_tokens <= 0 || q.start_pos < 0)
      return Status::Error("sequence " + std::to_string(s) + " has " + std::to_string(q.n_tokens) +
                           " tokens from position " + std::to_string(q.start_pos));
    if (q.start_pos + q.n_tokens > config_.max_position_embeddings)
      return Status::Error("sequence " + std::to_string(s) + " reaches position " +
                           std::to_string(q.start_pos + q.n_tokens - 1) +
                           ", past the model's context length of " +
                           std::to_string(config_.max_position_embeddings));
    total += q.n_tokens;
  }
  if (total != static_cast<int64_t>(tokens.size()))
    return Status::Error("sequences cover " + std::to_string(total) + " tokens but the batch has " +
                         std::to_string(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return Status::Error("token id " + std::to_string(tokens[i]) + " at batch index " +
                           std::to_string(i) + " is outside the vocabulary [0, " +
                           std::to_string(vocab) + ")");
  if (!options.forced_experts.empty()) {
    const int64_t k = config_.moe.top_k, per_token = config_.num_moe_layers() * k;
    if (per_token == 0 || static_cast<int64_t>(options.forced_experts.size()) != total * per_token)
      return Status::Error("forced expert ids: expected " + std::to_string(total * per_token) +
                           " ids ([tokens, moe layers, top_k]), got " +
                           std::to_string(options.forced_experts.size()));
    for (size_t i = 0; i < options.forced_experts.size(); ++i) {
      const int32_t e = options.forced_experts[i];
      if (e < 0 || e >= config_.moe.num_experts)
        return Status::Error("forced expert id " + std::to_string(e) + " at index " +
                             std::to_string(i) + " is outside [0, " +
                             std::to_string(config_.moe.num_experts) + ")");
      for (size_t j = i - i % k; j < i; ++j)
        if (options.forced_experts[j] == e)
          return Status::Error("forced expert id " + std::to_string(e) +
                               " is repeated for one token (index " + std::to_string(i) + ")");
    }
  }
  return Status::Ok();
}

Result<ForwardOutput> Model::forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                     KvStore& kv, const ForwardOptions& options,
                                     ThreadPool* pool) const {
  MILES_RETURN_IF_ERROR(check_batch(tokens, seqs, options));
  if (options.tape) MILES_RETURN_IF_ERROR(check_tape_batch(seqs, options));
  for (const SeqSpan& q : seqs)
    MILES_RETURN_IF_ERROR(kv.reserve(q.kv_slot, q.start_pos + q.n_tokens));
  const ModelConfig& c = config_;
  const int64_t t = tokens.size(), d = c.hidden_size;
  const BatchPlan plan = plan_batch(seqs, t);

  const int64_t begin = options.layer_begin;
  const int64_t end = options.layer_end < 0 ? c.num_layers : options.layer_end;
  if (begin < 0 || begin >= end || end > c.num_layers)
    return Status::Error("layer range [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") is not inside the model's " + std::to_string(c.num_layers) + " layers");
  MILES_RETURN_IF_ERROR(check_earlier_passes(c, t, seqs, begin, end, options));
  std::vector<float> h(static_cast<size_t>(t * d));
  const bool given = begin > 0 || !options.input_hidden.empty();
  MILES_RETURN_IF_ERROR(input_rows(c, *w_, tokens, given, begin, options, h));
  ForwardOutput out;
  const int64_t n_moe = c.num_moe_layers(), k = c.moe.top_k;
  if (options.return_experts && n_moe > 0) {
    out.experts.assign(static_cast<size_t>(t * n_moe * k), -1);
    out.expert_weights.assign(static_cast<size_t>(t * n_moe * k), 0.0f);
  }
  ForwardTape::Impl* tape = options.tape ? &options.tape->impl() : nullptr;
  if (tape) start_tape(*tape, tokens, seqs, plan, c.num_layers, begin, end, !given, options);
  const std::span<const int64_t> taps = options.tap_layers;
  MILES_RETURN_IF_ERROR(check_tap_layers(taps, begin, end));
  if (!taps.empty()) out.taps.resize(static_cast<size_t>(t) * taps.size() * d);
  ForwardBatch batch{seqs, plan, kv, t, options, out};
  CpuLayers layers(c, *w_, batch, h.data(), pool);
  for (int64_t layer = begin, tap = 0; layer < end; ++layer) {
    MILES_RETURN_IF_ERROR(layers.run(layer, tape ? &tape->layers[layer] : nullptr));
    if (tap < static_cast<int64_t>(taps.size()) && taps[tap] == layer) {
      const int64_t n = taps.size();
      for (int64_t i = 0; i < t; ++i)
        std::copy_n(h.data() + i * d, d, out.taps.data() + (i * n + tap) * d);
      ++tap;
    }
  }

  if (end < c.num_layers) {
    out.hidden = std::move(h);
    return out;
  }
  if (options.return_hidden) out.hidden = h;
  // Final norm and LM head over the rows asked for.
  const std::vector<int64_t> rows = head_rows(options, seqs, plan, t);
  std::vector<float> sel(rows.size() * d);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(h.data() + rows[r] * d, d, sel.data() + r * d);
  if (tape) {
    tape->h_final = sel;
    tape->head_rows = rows;
  }
  kernels::rmsnorm(sel.data(), rows.size(), d, w_->final_norm.data(),
                   static_cast<float>(c.rms_norm_eps), sel.data());
  if (tape) tape->normed = sel;
  out.rows = rows.size();
  out.vocab = c.vocab_size;
  if (options.logits_storage) out.logits = std::move(*options.logits_storage);
  out.logits.resize(static_cast<size_t>(out.rows * c.vocab_size));  // all written by the GEMM
  kernels::gemm(sel.data(), out.rows, d, w_->lm_head, out.logits.data(), c.vocab_size, pool);
  return out;
}

}  // namespace miles
