// DeviceModel over a backend B: the model's device state (weights uploaded in the CPU's packed
// layouts, their transposed packs for the backward, the KV pool shared across weight generations,
// scratch and the training tape) and its phases' helpers. The passes themselves:
// device_forward_impl.h (run_forward, forward_train) and device_backward_impl.h (backward).
//
// A backend provides: Status alloc(size_t bytes, void** p) (zero-filled), void release(void*),
// Status upload(void* dst, const void* src, size_t), Status download(void* dst, const void* src,
// size_t), template <class K> void launch(int64_t n, const K& k) (k(i) for i in [0, n), any order),
// template <class K> void launch_blocks(int64_t blocks, const K& k) (a block kernel's phases, see
// device_tiled_gemm.h), Status sync() (waits; the first error of anything launched since the last
// sync), Device device(). Instantiated for the emulated device (device_model.cc, host_backend.h)
// and CUDA (device_model_cuda.cu).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "device/device_kernels.h"
#include "device/device_tiled_gemm.h"
#include "miles/device_model.h"
#include "miles/kernels.h"
#include "model/model_weights.h"

namespace miles::device {

// Device allocations freed together.
template <class B>
class Arena {
 public:
  explicit Arena(std::shared_ptr<B> backend) : b_(std::move(backend)) {}
  ~Arena() {
    for (void* p : owned_) b_->release(p);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  template <class T>
  Result<T*> alloc(int64_t n) {
    void* p = nullptr;
    const size_t bytes = sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1));
    MILES_RETURN_IF_ERROR(b_->alloc(bytes, &p));
    owned_.push_back(p);
    bytes_ += static_cast<int64_t>(bytes);
    return static_cast<T*>(p);
  }
  template <class T>
  Result<T*> upload(const T* src, int64_t n) {
    MILES_ASSIGN_OR_RETURN(T * p, alloc<T>(n));
    if (n > 0) MILES_RETURN_IF_ERROR(b_->upload(p, src, sizeof(T) * static_cast<size_t>(n)));
    return p;
  }
  int64_t bytes() const { return bytes_; }
  B& backend() { return *b_; }

 private:
  std::shared_ptr<B> b_;
  std::vector<void*> owned_;
  int64_t bytes_ = 0;
};

struct DevMatrix {
  const float* data = nullptr;
  int64_t n = 0, k = 0, chunk = 0;
};
struct DevLayer {
  const float *input_norm = nullptr, *qkv_bias = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const float *o_bias = nullptr, *post_norm = nullptr;
  const float *attn_out_norm = nullptr, *mlp_out_norm = nullptr;  // Gemma 3
  const float *gate_up_bias = nullptr, *down_bias = nullptr;      // mlp_bias
  DevMatrix qkv, o, gate_up, down;
  DevMatrix qkv_t, o_t, gate_up_t, down_t;  // the transposed packs, made for the backward
  // Qwen3-MoE layers: the router, and every expert's packs one after another (shapes in the
  // DevMatrix, data = expert 0's).
  bool moe = false;
  DevMatrix router, expert_gate_up, expert_down;
  DevMatrix router_t, expert_gate_up_t, expert_down_t;  // transposed (per expert, concatenated)
  // GLM-4 MoE: the router's score-correction bias, and the shared expert (when `shared`).
  const float* router_bias = nullptr;
  bool shared = false;
  DevMatrix shared_gate_up, shared_down, shared_gate_up_t, shared_down_t;
  // MLA (mla.h): the latent norms, q_b_proj, per head W_kbᵀ and W_vb, and the backward's
  // transposes (q_b_projᵀ, per head W_kb and W_vbᵀ).
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
  DevMatrix q_b, q_b_t;
  std::vector<DevMatrix> kb_t, vb, kb, vb_t;
};

// A scratch buffer that grows to the largest size asked for.
template <class T>
struct Scratch {
  T* p = nullptr;
  int64_t cap = 0;
};

// A training forward's activations on the device (ForwardTape::Impl's): each layer's kept ones
// (LayerProgram::keeps), and what the backward needs of its batch.
struct DevTapeLayer {
  std::array<float*, kNumActs> acts{};
  // MoE layers: router softmax [T, E], ids and weights [T, k], per routed slot the expert's gate/up
  // [T·k, 2 f], activation [T·k, f] and output [T·k, d].
  float *probs = nullptr, *moe_weights = nullptr, *moe_gate_up = nullptr, *moe_act = nullptr;
  float* moe_y = nullptr;
  int32_t* moe_ids = nullptr;
  float *shared_gate_up = nullptr, *shared_act = nullptr;  // the shared expert's [T, 2 fs], [T, fs]
  float* operator[](Act a) const { return acts[static_cast<int>(a)]; }
};
struct DevTape {
  int64_t t = 0;
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  std::vector<int64_t> offset;  // first token of each sequence
  std::vector<DevTapeLayer> layers;
  float *h_final = nullptr, *normed = nullptr;  // [rows, d]: the LM head's rows
  int64_t rows = 0;                             // the LM head's rows (T, or the logit_rows)
  const int32_t* d_rows = nullptr;              // their token indices, on the device
  const int32_t* d_tokens = nullptr;   // on the device, valid until the next forward
  const float* d_cos = nullptr;        // RoPE tables of the tokens ([T][rotary_dim / 2])
  const float* d_neg_sin = nullptr;    // −sin: the inverse rotation
  const float* d_cos_local = nullptr;  // the same from rope_local_ (Gemma 3's sliding layers)
  const float* d_neg_sin_local = nullptr;
};

template <class B>
class BackendBackward;

template <class B>
class BackendModel final : public DeviceModel {
 public:
  struct Kv {
    explicit Kv(std::shared_ptr<B> b) : arena(std::move(b)) {}
    Arena<B> arena;
    float *k = nullptr, *v = nullptr;  // [layers][num_blocks][kv_dim * block_tokens]
    int64_t num_blocks = 0, block_tokens = 0, block_floats = 0;
  };

  BackendModel(std::shared_ptr<B> b, ModelConfig config, std::shared_ptr<Kv> kv)
      : b_(b),
        config_(std::move(config)),
        kv_(std::move(kv)),
        weights_(b),
        scratch_(b),
        transposed_(b) {}

  static Result<std::unique_ptr<BackendModel>> create(std::shared_ptr<B> b,
                                                      const ModelConfig& config,
                                                      const TensorMap& weights,
                                                      const DeviceKvGeometry& geometry,
                                                      ThreadPool* pool) {
    MILES_RETURN_IF_ERROR(device_supports(config));
    if (geometry.num_blocks <= 0 || geometry.block_tokens <= 0)
      return Status::Error("device KV pool: " + std::to_string(geometry.num_blocks) +
                           " blocks of " + std::to_string(geometry.block_tokens) + " positions");
    MILES_ASSIGN_OR_RETURN(std::shared_ptr<Kv> kv,
                           make_kv(b, config, geometry.num_blocks, geometry.block_tokens));
    auto m = std::make_unique<BackendModel>(b, config, std::move(kv));
    MILES_RETURN_IF_ERROR(m->load(weights, pool));
    m->pool_ = pool;
    return std::unique_ptr<BackendModel>(std::move(m));
  }

  static Result<std::shared_ptr<Kv>> make_kv(std::shared_ptr<B> b, const ModelConfig& config,
                                             int64_t num_blocks, int64_t block_tokens) {
    auto kv = std::make_shared<Kv>(b);
    kv->num_blocks = num_blocks;
    kv->block_tokens = block_tokens;
    kv->block_floats = config.kv_dim() * block_tokens;
    const int64_t floats = config.num_layers * kv->num_blocks * kv->block_floats;
    MILES_ASSIGN_OR_RETURN(kv->k, kv->arena.template alloc<float>(floats));
    MILES_ASSIGN_OR_RETURN(kv->v, kv->arena.template alloc<float>(floats));
    return kv;
  }

  Device device() const override { return b_->device(); }
  const ModelConfig& config() const override { return config_; }
  int64_t weight_bytes() const override { return weights_.bytes(); }
  int64_t kv_bytes() const override { return kv_->arena.bytes(); }

  Result<std::unique_ptr<DeviceModel>> with_weights(const TensorMap& weights) const override {
    auto m = std::make_unique<BackendModel>(b_, config_, kv_);
    m->pool_ = pool_;
    MILES_RETURN_IF_ERROR(m->load(weights, pool_));
    return std::unique_ptr<DeviceModel>(std::move(m));
  }

  Status copy_kv_block(int32_t src, int32_t dst, int64_t positions) override {
    if (positions <= 0) return Status::Ok();
    MILES_CHECK(src >= 0 && src < kv_->num_blocks && dst >= 0 && dst < kv_->num_blocks);
    b_->launch(config_.num_layers * kv_->block_floats,
               CopyBlockKernel{kv_->k, kv_->v, kv_->num_blocks, kv_->block_floats, src, dst});
    return b_->sync();
  }

  Result<ForwardOutput> forward(const DeviceBatch& batch) override {
    return run_forward(batch, *kv_, nullptr);
  }
  Result<ForwardOutput> forward_train(std::span<const int32_t> tokens,
                                      std::span<const SeqSpan> seqs, bool keep_tape,
                                      std::span<const int32_t> forced_experts,
                                      std::span<const int64_t> logit_rows,
                                      std::span<const int64_t> tap_layers) override;
  Status backward(std::span<const float> dlogits, FlatTensors& grads,
                  std::span<float> tied_head_grad) override;
  Status reload_weights(const TensorMap& weights) override { return load(weights, pool_); }

  // An activation the last forward_train(keep_tape) kept (tests name the op whose output differs).
  Result<std::vector<float>> kept_activation(int64_t layer, Act a) const {
    if (layer < 0 || layer >= static_cast<int64_t>(tape_.layers.size()) ||
        tape_.layers[layer][a] == nullptr)
      return Status::Error("no kept " + std::string(act_name(a)) + " of layer " +
                           std::to_string(layer));
    std::vector<float> v(static_cast<size_t>(tape_.t * act_width(config_, a)));
    MILES_RETURN_IF_ERROR(b_->download(v.data(), tape_.layers[layer][a], sizeof(float) * v.size()));
    return v;
  }

 private:
  // An array uploaded into its own new buffer, or (a reload) into the one it had: same shapes.
  Status put(const float* src, int64_t n, const float*& dst) {
    if (n == 0) {
      dst = nullptr;
      return Status::Ok();
    }
    if (reloading_) return b_->upload(const_cast<float*>(dst), src, sizeof(float) * n);
    MILES_ASSIGN_OR_RETURN(float* p, weights_.upload(src, n));
    dst = p;
    return Status::Ok();
  }
  Status put(const kernels::PackedMatrix& m, DevMatrix& d) {
    d.n = m.n();
    d.k = m.k();
    d.chunk = m.chunk();
    return put(d.n == 0 ? nullptr : m.panel(0), d.n == 0 ? 0 : m.num_panels() * m.k() * kPanel,
               d.data);
  }
  Status put(const std::vector<float>& v, const float*& dst) {
    return put(v.data(), static_cast<int64_t>(v.size()), dst);
  }
  // Every expert's `which` matrix, concatenated (all experts have one shape).
  Status put_experts(const std::vector<ExpertWeights>& ex,
                     kernels::PackedMatrix ExpertWeights::*which, DevMatrix& d) {
    const kernels::PackedMatrix& m0 = ex.front().*which;
    d.n = m0.n();
    d.k = m0.k();
    d.chunk = m0.chunk();
    const int64_t per = m0.num_panels() * m0.k() * kPanel;
    std::vector<float> all(static_cast<size_t>(per * static_cast<int64_t>(ex.size())));
    for (size_t e = 0; e < ex.size(); ++e)
      std::copy_n((ex[e].*which).panel(0), per, all.data() + e * per);
    return put(all, d.data);
  }
  static int64_t expert_floats(const DevMatrix& m) {
    return (m.n + kPanel - 1) / kPanel * m.k * kPanel;
  }

  // The CPU's conversion (names, shapes, packing), then every array uploaded as is; a second load
  // (new values of the same tensors) reuses the device buffers.
  Status load(const TensorMap& weights, ThreadPool* pool) {
    MILES_ASSIGN_OR_RETURN(ModelWeights w, load_model_weights(config_, weights, pool));
    reloading_ = embed_ != nullptr;
    rope_ = w.rope;
    rope_local_ = w.rope_local;
    programs_ = w.programs;
    MILES_RETURN_IF_ERROR(put(w.embed, embed_));
    MILES_RETURN_IF_ERROR(put(w.final_norm, final_norm_));
    MILES_RETURN_IF_ERROR(put(w.lm_head, lm_head_));
    layers_.resize(w.layers.size());
    for (size_t i = 0; i < w.layers.size(); ++i) {
      const LayerWeights& l = w.layers[i];
      DevLayer& d = layers_[i];
      MILES_RETURN_IF_ERROR(put(l.input_norm, d.input_norm));
      MILES_RETURN_IF_ERROR(put(l.qkv, d.qkv));
      MILES_RETURN_IF_ERROR(put(l.qkv_bias, d.qkv_bias));
      MILES_RETURN_IF_ERROR(put(l.q_norm, d.q_norm));
      MILES_RETURN_IF_ERROR(put(l.k_norm, d.k_norm));
      MILES_RETURN_IF_ERROR(put(l.o, d.o));
      MILES_RETURN_IF_ERROR(put(l.o_bias, d.o_bias));
      MILES_RETURN_IF_ERROR(put(l.post_norm, d.post_norm));
      MILES_RETURN_IF_ERROR(put(l.attn_out_norm, d.attn_out_norm));
      MILES_RETURN_IF_ERROR(put(l.mlp_out_norm, d.mlp_out_norm));
      MILES_RETURN_IF_ERROR(put(l.gate_up, d.gate_up));
      MILES_RETURN_IF_ERROR(put(l.down, d.down));
      MILES_RETURN_IF_ERROR(put(l.gate_up_bias, d.gate_up_bias));
      MILES_RETURN_IF_ERROR(put(l.down_bias, d.down_bias));
      if (config_.is_mla()) {
        MILES_RETURN_IF_ERROR(put(l.mla.q_a_norm, d.q_a_norm));
        MILES_RETURN_IF_ERROR(put(l.mla.kv_a_norm, d.kv_a_norm));
        if (config_.mla.q_lora_rank > 0) MILES_RETURN_IF_ERROR(put(l.mla.q_b, d.q_b));
        d.kb_t.resize(l.mla.kb_t.size());
        d.vb.resize(l.mla.vb.size());
        for (size_t h = 0; h < l.mla.kb_t.size(); ++h) {
          MILES_RETURN_IF_ERROR(put(l.mla.kb_t[h], d.kb_t[h]));
          MILES_RETURN_IF_ERROR(put(l.mla.vb[h], d.vb[h]));
        }
      }
      d.moe = l.moe;
      if (l.moe) {
        MILES_RETURN_IF_ERROR(put(l.router, d.router));
        MILES_RETURN_IF_ERROR(put_experts(l.experts, &ExpertWeights::gate_up, d.expert_gate_up));
        MILES_RETURN_IF_ERROR(put_experts(l.experts, &ExpertWeights::down, d.expert_down));
        MILES_RETURN_IF_ERROR(put(l.router_bias, d.router_bias));
        d.shared = l.has_shared;
        if (d.shared) {
          MILES_RETURN_IF_ERROR(put(l.shared.gate_up, d.shared_gate_up));
          MILES_RETURN_IF_ERROR(put(l.shared.down, d.shared_down));
        }
      }
    }
    reloading_ = false;
    transposed_fresh_ = false;  // the backward remakes them from these values
    return b_->sync();
  }

  // The transposed packs of every matrix (d x = d y · W reads them as a forward GEMM does, with
  // chunk gemm_chunk(N)), made on the device from the current weights: allocated once, refilled
  // after every reload.
  Status make_transposed() {
    if (transposed_fresh_) return Status::Ok();
    auto one = [&](const DevMatrix& w, DevMatrix& t) -> Status {
      t.n = w.k;
      t.k = w.n;
      t.chunk = kernels::gemm_chunk(w.n);
      const int64_t floats = (w.k + kPanel - 1) / kPanel * kPanel * w.n;
      if (t.data == nullptr) {
        MILES_ASSIGN_OR_RETURN(float* p, transposed_.template alloc<float>(floats));
        t.data = p;
      }
      b_->launch(floats, TransposePackKernel{w.data, w.n, w.k, const_cast<float*>(t.data)});
      return Status::Ok();
    };
    // Every expert's matrix of one kind, transposed into one buffer.
    auto experts = [&](const DevMatrix& w, DevMatrix& t) -> Status {
      t.n = w.k;
      t.k = w.n;
      t.chunk = kernels::gemm_chunk(w.n);
      const int64_t e = config_.moe.num_experts;
      const int64_t per = expert_floats(w), per_t = expert_floats(t);
      if (t.data == nullptr) {
        MILES_ASSIGN_OR_RETURN(float* p, transposed_.template alloc<float>(e * per_t));
        t.data = p;
      }
      b_->launch(e * per_t,
                 ExpertTransposeKernel{w.data, w.n, w.k, per, per_t, const_cast<float*>(t.data)});
      return Status::Ok();
    };
    MILES_RETURN_IF_ERROR(one(lm_head_, lm_head_t_));
    for (DevLayer& l : layers_) {
      MILES_RETURN_IF_ERROR(one(l.qkv, l.qkv_t));
      MILES_RETURN_IF_ERROR(one(l.o, l.o_t));
      if (l.q_b.data != nullptr) MILES_RETURN_IF_ERROR(one(l.q_b, l.q_b_t));
      l.kb.resize(l.kb_t.size());
      l.vb_t.resize(l.vb.size());
      for (size_t h = 0; h < l.kb_t.size(); ++h) {
        MILES_RETURN_IF_ERROR(one(l.kb_t[h], l.kb[h]));
        MILES_RETURN_IF_ERROR(one(l.vb[h], l.vb_t[h]));
      }
      if (l.moe) {
        MILES_RETURN_IF_ERROR(one(l.router, l.router_t));
        MILES_RETURN_IF_ERROR(experts(l.expert_gate_up, l.expert_gate_up_t));
        MILES_RETURN_IF_ERROR(experts(l.expert_down, l.expert_down_t));
        if (l.shared) {
          MILES_RETURN_IF_ERROR(one(l.shared_gate_up, l.shared_gate_up_t));
          MILES_RETURN_IF_ERROR(one(l.shared_down, l.shared_down_t));
        }
        continue;
      }
      MILES_RETURN_IF_ERROR(one(l.gate_up, l.gate_up_t));
      MILES_RETURN_IF_ERROR(one(l.down, l.down_t));
    }
    transposed_fresh_ = true;
    return Status::Ok();
  }

  Result<ForwardOutput> run_forward(const DeviceBatch& batch, Kv& kv, DevTape* tape,
                                    const int32_t* d_forced = nullptr);
  struct HostBatch;  // a batch's tables and RoPE values, made on the host (device_forward_impl.h)
  Result<HostBatch> host_batch(const DeviceBatch& batch, const Kv& kv) const;
  Status lay_out_tape(DevTape& tape, int64_t t);
  struct LayerRun;  // what one forward's layers share (device_forward_impl.h)
  Status forward_op(const Op& op, LayerRun& r);

  // moe.cc's moe_block on the device: router GEMM, routing per token, one GEMM per routed slot
  // (gate/up, SwiGLU, down), the slots summed per token in ascending expert id into `out` (plus the
  // shared expert's output, run over every token). The
  // ids and weights go to record (ids [T, moe_layers, k] as int32 bits, then the weights) when
  // given.
  Status moe_block(const DevLayer& l, const float* xn, int64_t t, int64_t moe_index, float* record,
                   const int32_t* forced, DevTapeLayer* tape, float* out) {
    const ModelConfig& c = config_;
    const int64_t e = c.moe.num_experts, k = c.moe.top_k, d = c.hidden_size;
    const int64_t f = c.moe.moe_intermediate_size, n_moe = c.num_moe_layers();
    const int64_t slots = t * k, fs = l.shared ? c.moe.n_shared_experts * f : 0;
    MILES_ASSIGN_OR_RETURN(
        float* buf, scratch(moe_, t * e + 2 * slots + slots * (3 * f + d) + t * (3 * fs + d)));
    float* probs = buf;
    int32_t* ids = reinterpret_cast<int32_t*>(probs + t * e);
    float* weights = probs + t * e + slots;
    float* gu = weights + slots;
    float* act = gu + slots * 2 * f;
    float* y = act + slots * f;
    float* shared_gu = y + slots * d;
    float* shared_act = shared_gu + t * 2 * fs;
    float* shared_y = shared_act + t * fs;
    if (tape) {  // a training forward keeps them all (but the shared expert's output)
      probs = tape->probs;
      ids = tape->moe_ids;
      weights = tape->moe_weights;
      gu = tape->moe_gate_up;
      act = tape->moe_act;
      y = tape->moe_y;
      shared_gu = tape->shared_gate_up;
      shared_act = tape->shared_act;
    }
    gemm(xn, t, d, l.router, probs, e);
    int32_t* rec_ids = record ? reinterpret_cast<int32_t*>(record) + moe_index * k : nullptr;
    float* rec_w = record ? record + t * n_moe * k + moe_index * k : nullptr;
    const int32_t* forced_rows = forced ? forced + moe_index * k : nullptr;
    RouteKernel route{probs, e,       k,       forced_rows, n_moe * k, c.moe.norm_topk_prob,
                      ids,   weights, rec_ids, rec_w,       n_moe * k};
    if (c.moe.score == RouterScore::kSigmoid) {
      route.bias = l.router_bias;
      route.n_group = c.moe.n_group;
      route.topk_group = c.moe.topk_group;
      route.scale = static_cast<float>(c.moe.routed_scaling_factor);
    }
    b_->launch(t, route);
    const DevMatrix& gw = l.expert_gate_up;
    const DevMatrix& dw = l.expert_down;
    b_->launch(GemmKernel::items(slots, gw.n),
               ExpertGemmKernel{xn, d, k, ids, gw.data, expert_floats(gw), slots, gw.n, gw.k,
                                gw.chunk, gu, 2 * f});
    b_->launch(slots * f, SwigluKernel{gu, f, act});
    b_->launch(GemmKernel::items(slots, dw.n),
               ExpertGemmKernel{act, f, 1, ids, dw.data, expert_floats(dw), slots, dw.n, dw.k,
                                dw.chunk, y, d});
    if (l.shared) {
      gemm(xn, t, d, l.shared_gate_up, shared_gu, 2 * fs);
      b_->launch(t * fs, SwigluKernel{shared_gu, fs, shared_act});
      gemm(shared_act, t, fs, l.shared_down, shared_y, d);
    }
    b_->launch(t * d, MoeCombineKernel{y, ids, weights, k, d, out, l.shared ? shared_y : nullptr});
    return Status::Ok();
  }
  // mla.cc's mla_qkv on the device: the query path (q_a_layernorm, q_b_proj; or q_proj's rows as
  // they are), the normed latent, the assembled rows, then each head's absorbed query.
  Status mla_qkv(const DevLayer& l, const float* a, int64_t t, float* qkv) {
    const MlaDims d(config_);
    const int64_t h = d.h, qk = d.qk, r = d.r, kl = d.kl, ql = d.ql, hd = d.hd;
    const int64_t kv_at = d.kv_at, wa = d.wa, ld = d.ld;
    MILES_ASSIGN_OR_RETURN(float* buf, scratch(mla_, t * (h * qk + ql + kl)));
    float* qan = buf + t * h * qk;
    float* lat = qan + t * ql;
    const float* q = a;  // q_proj's rows, or q_b_proj's output
    int64_t qld = wa;
    if (ql > 0) {
      b_->launch(t, RmsnormKernel{a, wa, l.q_a_norm, ql, kMlaNormEps, qan, ql});
      gemm(qan, t, ql, l.q_b, buf, h * qk);
      q = buf;
      qld = h * qk;
    }
    b_->launch(t, RmsnormKernel{a + kv_at, wa, l.kv_a_norm, kl, kMlaNormEps, lat, kl});
    b_->launch(t * (h * r + 2 * hd), MlaAssembleKernel{q, qld, a, wa, kv_at, lat, h, d.nope, r, kl,
                                                       config_.mla.rope_interleave, qkv});
    for (int64_t x = 0; x < h; ++x) gemm(q + x * qk, t, qld, l.kb_t[x], qkv + x * hd + r, ld);
    return Status::Ok();
  }
  // mla.cc's mla_out: each head's latent output times W_vbᵀ.
  void mla_out(const DevLayer& l, const float* attn, int64_t t, float* out) {
    const MlaDims d(config_);
    for (int64_t x = 0; x < d.h; ++x)
      gemm(attn + x * d.hd + d.r, t, d.qd, l.vb[x], out + x * d.v, d.h * d.v);
  }

  static const DevMatrix& matrix(const DevLayer& l, Param p) {
    switch (p) {
      case Param::kQkv:
        return l.qkv;
      case Param::kO:
        return l.o;
      case Param::kGateUp:
        return l.gate_up;
      default:
        MILES_CHECK(p == Param::kDown, "a matrix parameter");
        return l.down;
    }
  }
  static const float* norm_of(const DevLayer& l, Param p) {
    switch (p) {
      case Param::kInputNorm:
        return l.input_norm;
      case Param::kAttnOutNorm:
        return l.attn_out_norm;
      case Param::kMlpOutNorm:
        return l.mlp_out_norm;
      default:
        MILES_CHECK(p == Param::kPostNorm, "a norm parameter");
        return l.post_norm;
    }
  }
  static const float* bias(const DevLayer& l, Param p) {
    switch (p) {
      case Param::kQkvBias:
        return l.qkv_bias;
      case Param::kOBias:
        return l.o_bias;
      case Param::kGateUpBias:
        return l.gate_up_bias;
      default:
        MILES_CHECK(p == Param::kDownBias, "a bias parameter");
        return l.down_bias;
    }
  }
  static const DevMatrix& transposed(const DevLayer& l, Param p) {
    switch (p) {
      case Param::kQkv:
        return l.qkv_t;
      case Param::kO:
        return l.o_t;
      case Param::kGateUp:
        return l.gate_up_t;
      default:
        MILES_CHECK(p == Param::kDown, "a matrix parameter");
        return l.down_t;
    }
  }
  // Device-to-device copy of n floats.
  void copy(float* dst, const float* src, int64_t n) { b_->launch(n, CopyKernel{src, dst}); }
  friend class BackendBackward<B>;

  template <class T>
  Result<T*> scratch(Scratch<T>& s, int64_t n) {
    if (n > s.cap) {
      // Grown buffers stay in the arena until the model goes (a few sizes over its life).
      MILES_ASSIGN_OR_RETURN(s.p, scratch_.template alloc<T>(n * 2));
      s.cap = n * 2;
    }
    return s.p;
  }

  // The tiled kernel where the reduction fits it (every matrix of the usual shapes but the LM
  // head's d x), else one thread per output; the same bits either way. MILES_DEVICE_GEMM=simple
  // forces the latter (to time one against the other).
  void gemm(const float* x, int64_t m, int64_t lda, const DevMatrix& w, float* y, int64_t ldy) {
    if (m == 0) return;
    static const bool simple = [] {
      const char* e = std::getenv("MILES_DEVICE_GEMM");
      return e != nullptr && std::string(e) == "simple";
    }();
    if (!simple && TiledGemmKernel::fits(w.k, w.chunk)) {
      const TiledGemmKernel tk{x, lda, w.data, m, w.n, w.k, w.chunk, y, ldy};
      b_->launch_blocks(tk.blocks(), tk);
      return;
    }
    b_->launch(GemmKernel::items(m, w.n), GemmKernel{x, lda, w.data, m, w.n, w.k, w.chunk, y, ldy});
  }

  std::shared_ptr<B> b_;
  ModelConfig config_;
  std::shared_ptr<Kv> kv_;
  Arena<B> weights_;
  Arena<B> scratch_;
  Arena<B> transposed_;
  bool transposed_fresh_ = false;
  DevMatrix lm_head_t_;
  ThreadPool* pool_ = nullptr;
  bool reloading_ = false;
  kernels::RopeTable rope_, rope_local_;  // rope_local_: empty unless a layer uses it
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  DevMatrix lm_head_;
  std::vector<DevLayer> layers_;
  std::vector<LayerProgram> programs_;  // each layer's (layer_program.h)
  Scratch<int32_t> ints_, forced_, slot_lists_;
  Scratch<float> rope_cs_, h_, sel_, logits_, moe_, record_, mla_;
  std::array<Scratch<float>, kNumActs> acts_;  // activations nothing keeps (scratch_home)
  // Training: the tape, its KV blocks, the backward's buffers.
  DevTape tape_;
  Scratch<float> tape_buf_;
  std::shared_ptr<Kv> train_kv_;
  Scratch<float> grads_, tied_, bwd_;
  Scratch<int64_t> bwd_ints_;
};

}  // namespace miles::device
