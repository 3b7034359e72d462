// DeviceModel over a backend B: the forward's phases as kernel launches (device_kernels.h), the
// weights uploaded in the CPU's packed layouts, the KV pool shared across weight generations.
//
// A backend provides: Status alloc(size_t bytes, void** p) (zero-filled), void release(void*),
// Status upload(void* dst, const void* src, size_t), Status download(void* dst, const void* src,
// size_t), template <class K> void launch(int64_t n, const K& k) (k(i) for i in [0, n), any order),
// Status sync() (waits; the first error of anything launched since the last sync), Device device().
// Instantiated for the host emulation (device_model_host.cc) and CUDA (device_model_cuda.cu).
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "device/device_kernels.h"
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
  DevMatrix qkv, o, gate_up, down;
};

// A scratch buffer that grows to the largest size asked for.
template <class T>
struct Scratch {
  T* p = nullptr;
  int64_t cap = 0;
};

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
      : b_(b), config_(std::move(config)), kv_(std::move(kv)), weights_(b), scratch_(b) {}

  static Result<std::unique_ptr<BackendModel>> create(std::shared_ptr<B> b,
                                                      const ModelConfig& config,
                                                      const TensorMap& weights,
                                                      const DeviceKvGeometry& geometry,
                                                      ThreadPool* pool) {
    MILES_RETURN_IF_ERROR(device_supports(config));
    if (geometry.num_blocks <= 0 || geometry.block_tokens <= 0)
      return Status::Error("device KV pool: " + std::to_string(geometry.num_blocks) +
                           " blocks of " + std::to_string(geometry.block_tokens) + " positions");
    auto kv = std::make_shared<Kv>(b);
    kv->num_blocks = geometry.num_blocks;
    kv->block_tokens = geometry.block_tokens;
    kv->block_floats = config.kv_dim() * geometry.block_tokens;
    const int64_t floats = config.num_layers * kv->num_blocks * kv->block_floats;
    MILES_ASSIGN_OR_RETURN(kv->k, kv->arena.template alloc<float>(floats));
    MILES_ASSIGN_OR_RETURN(kv->v, kv->arena.template alloc<float>(floats));
    auto m = std::make_unique<BackendModel>(b, config, std::move(kv));
    MILES_RETURN_IF_ERROR(m->load(weights, pool));
    m->pool_ = pool;
    return std::unique_ptr<BackendModel>(std::move(m));
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

  Result<ForwardOutput> forward(const DeviceBatch& batch) override;

 private:
  Result<DevMatrix> put(const kernels::PackedMatrix& m) {
    DevMatrix d;
    d.n = m.n();
    d.k = m.k();
    d.chunk = m.chunk();
    if (d.n == 0) return d;
    MILES_ASSIGN_OR_RETURN(d.data, weights_.upload(m.panel(0), m.num_panels() * m.k() * kPanel));
    return d;
  }
  Result<const float*> put(const std::vector<float>& v) {
    if (v.empty()) return static_cast<const float*>(nullptr);
    MILES_ASSIGN_OR_RETURN(float* p, weights_.upload(v.data(), static_cast<int64_t>(v.size())));
    return static_cast<const float*>(p);
  }

  // The CPU's conversion (names, shapes, packing), then every array uploaded as is.
  Status load(const TensorMap& weights, ThreadPool* pool) {
    MILES_ASSIGN_OR_RETURN(ModelWeights w, load_model_weights(config_, weights, pool));
    rope_ = w.rope;
    MILES_ASSIGN_OR_RETURN(embed_, put(w.embed));
    MILES_ASSIGN_OR_RETURN(final_norm_, put(w.final_norm));
    MILES_ASSIGN_OR_RETURN(lm_head_, put(w.lm_head));
    layers_.clear();
    for (const LayerWeights& l : w.layers) {
      DevLayer d;
      MILES_ASSIGN_OR_RETURN(d.input_norm, put(l.input_norm));
      MILES_ASSIGN_OR_RETURN(d.qkv, put(l.qkv));
      MILES_ASSIGN_OR_RETURN(d.qkv_bias, put(l.qkv_bias));
      MILES_ASSIGN_OR_RETURN(d.q_norm, put(l.q_norm));
      MILES_ASSIGN_OR_RETURN(d.k_norm, put(l.k_norm));
      MILES_ASSIGN_OR_RETURN(d.o, put(l.o));
      MILES_ASSIGN_OR_RETURN(d.o_bias, put(l.o_bias));
      MILES_ASSIGN_OR_RETURN(d.post_norm, put(l.post_norm));
      MILES_ASSIGN_OR_RETURN(d.gate_up, put(l.gate_up));
      MILES_ASSIGN_OR_RETURN(d.down, put(l.down));
      layers_.push_back(d);
    }
    return b_->sync();
  }

  template <class T>
  Result<T*> scratch(Scratch<T>& s, int64_t n) {
    if (n > s.cap) {
      // Grown buffers stay in the arena until the model goes (a few sizes over its life).
      MILES_ASSIGN_OR_RETURN(s.p, scratch_.template alloc<T>(n * 2));
      s.cap = n * 2;
    }
    return s.p;
  }

  void gemm(const float* x, int64_t m, int64_t lda, const DevMatrix& w, float* y, int64_t ldy) {
    b_->launch(m * w.n, GemmKernel{x, lda, w.data, w.n, w.k, w.chunk, y, ldy});
  }

  std::shared_ptr<B> b_;
  ModelConfig config_;
  std::shared_ptr<Kv> kv_;
  Arena<B> weights_;
  Arena<B> scratch_;
  ThreadPool* pool_ = nullptr;
  kernels::RopeTable rope_;
  const float* embed_ = nullptr;
  const float* final_norm_ = nullptr;
  DevMatrix lm_head_;
  std::vector<DevLayer> layers_;
  Scratch<int32_t> ints_;
  Scratch<float> rope_cs_, h_, xn_, qkv_, attn_, proj_, gate_up_, act_, sel_, logits_;
};

template <class B>
Result<ForwardOutput> BackendModel<B>::forward(const DeviceBatch& batch) {
  const ModelConfig& c = config_;
  const int64_t t = static_cast<int64_t>(batch.tokens.size()), d = c.hidden_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim, ld = qd + 2 * kvd;
  const int64_t f = c.intermediate_size, bt = kv_->block_tokens;
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
      if (b < 0 || b >= kv_->num_blocks)
        return Status::Error("device forward: block id " + std::to_string(b) +
                             " is outside the device pool of " + std::to_string(kv_->num_blocks) +
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
  std::vector<float> cs(static_cast<size_t>(2 * t * std::max<int64_t>(half, 1)));
  for (int64_t r = 0; r < t; ++r) {
    const float pos = static_cast<float>(positions[r]);
    for (int64_t j = 0; j < half; ++j) {
      const float angle = pos * rope_.inv_freq[j];
      cs[r * half + j] = std::cos(angle) * rope_.attention_scaling;
      cs[(t + r) * half + j] = std::sin(angle) * rope_.attention_scaling;
    }
  }
  const int64_t nr = static_cast<int64_t>(rows.size());
  std::vector<int32_t> ints;
  ints.reserve(static_cast<size_t>(4 * t + nr) + tables.size());
  for (const auto* v : {&positions, &block_of, &table_of, &rows, &tables})
    ints.insert(ints.end(), v->begin(), v->end());
  ints.insert(ints.begin(), batch.tokens.begin(), batch.tokens.end());

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

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  b_->launch(t * d, EmbedKernel{embed_, d_tokens, d, h});
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const DevLayer& l = layers_[layer];
    float* k_layer = kv_->k + layer * kv_->num_blocks * kv_->block_floats;
    float* v_layer = kv_->v + layer * kv_->num_blocks * kv_->block_floats;
    // Attention block.
    b_->launch(t, RmsnormKernel{h, d, l.input_norm, d, eps, xn, d});
    gemm(xn, t, d, l.qkv, qkv, ld);
    if (l.qkv_bias) b_->launch(t * ld, AddBiasKernel{qkv, ld, ld, l.qkv_bias});
    b_->launch(t * (c.num_heads + c.num_kv_heads),
               QkNormRopeKernel{qkv, ld, c.num_heads, c.num_kv_heads, hd, half, l.q_norm, l.k_norm,
                                eps, dcs, dcs + t * half});
    b_->launch(t * kvd,
               KvStoreKernel{qkv, ld, qd, kvd, hd, bt, d_pos, d_block_of, k_layer, v_layer});
    b_->launch(t * c.num_heads,
               AttentionKernel{qkv, ld, c.num_heads, c.num_kv_heads, hd, bt, kvd, d_pos, d_table_of,
                               d_tables, k_layer, v_layer, scale, attn, qd});
    gemm(attn, t, qd, l.o, proj, d);
    if (l.o_bias) b_->launch(t * d, AddBiasKernel{proj, d, d, l.o_bias});
    b_->launch(t * d, AddKernel{h, proj});
    // MLP block.
    b_->launch(t, RmsnormKernel{h, d, l.post_norm, d, eps, xn, d});
    gemm(xn, t, d, l.gate_up, gu, 2 * f);
    b_->launch(t * f, SwigluKernel{gu, f, act});
    gemm(act, t, f, l.down, proj, d);
    b_->launch(t * d, AddKernel{h, proj});
  }
  b_->launch(nr * d, GatherRowsKernel{h, d_rows, d, sel});
  b_->launch(nr, RmsnormKernel{sel, d, final_norm_, d, eps, sel, d});
  gemm(sel, nr, d, lm_head_, logits, c.vocab_size);

  ForwardOutput out;
  out.rows = nr;
  out.vocab = c.vocab_size;
  out.logits.resize(static_cast<size_t>(nr * c.vocab_size));
  MILES_RETURN_IF_ERROR(b_->download(out.logits.data(), logits, sizeof(float) * out.logits.size()));
  MILES_RETURN_IF_ERROR(b_->sync());
  return out;
}

}  // namespace miles::device
