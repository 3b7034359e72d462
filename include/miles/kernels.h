// CPU kernels of the shared model, batch-invariant by construction.
//
// Why: the rollout engine and the trainer must compute identical bits for a token whatever batch it
// sits in. Every kernel here reduces in a fixed order that depends only on the reduced length —
// never on the number of rows, a row's position in the batch, the thread count or the instruction
// set — so a row computed alone and inside a batch of 64 gives identical bits
// (tests/kernels_test.cc proves it per kernel).
//
// The numerics contract (docs/architecture.md, "Numerics"):
//  * dot products over K (GEMM): K is cut into equal chunks of gemm_chunk(K) (at most kGemmChunk);
//    inside a chunk the products are accumulated with fma in ascending k from 0; chunk partials are
//    combined by a balanced halving tree (split [lo, hi) at lo + ceil((hi - lo) / 2)). The chunk
//    count is a multiple of 8 (else 4, else 2) where K allows, so a tensor-parallel split of K into
//    2, 4 or 8 equal parts falls on subtree boundaries and the ranks' partials, summed by the same
//    tree over ranks, give the single-process bits.
//  * row reductions (RMSNorm sum of squares, softmax sums): chunks of kGemmChunk, the same tree.
//  * attention: online softmax over key blocks of kAttnBlock positions from position 0, ascending
//    (a sliding window skips the blocks before it and scores the keys before it −inf).
//  * exp: miles' exp_f32 (src/kernels/exp.h), the same bits in scalar and SIMD code, never libm's.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "miles/huge_pages.h"
#include "miles/model_config.h"
#include "miles/status.h"
#include "miles/tensor.h"

namespace miles {
class ThreadPool;
}

namespace miles::kernels {

// K positions per row-reduction chunk; GEMM chunks' bound.
inline constexpr int64_t kGemmChunk = 128;
// The GEMM chunk length for a reduction of length k: k / n, where n is the fewest chunks of at most
// kGemmChunk rounded up to a multiple of 8 (else 4, else 2), when n divides k; otherwise kGemmChunk
// (the last chunk shorter). A pure function of k: every layout and batch shape of one K reduce
// alike. Examples: 2048 → 16 × 128, 576 → 8 × 72, 1536 → 16 × 96, 172 → 4 × 43, 64 → 8 × 8.
int64_t gemm_chunk(int64_t k);
// The chunk length of a weight gradient's reduction over its M token rows (dW = dYᵀ·X, every
// backend): kGemmChunk, the last chunk shorter. No layout splits a micro-batch's tokens between
// ranks, so this reduction needs none of gemm_chunk's equal splits for tensor parallelism, and
// fewer, longer chunks keep the GEMM tile in its fma loop (256 tokens: 2 × 128, not 8 × 32).
inline constexpr int64_t kWeightGradChunk = kGemmChunk;
inline constexpr int64_t kPanel = 32;      // output columns per packed weight panel
inline constexpr int64_t kAttnBlock = 32;  // key positions per online-softmax block

enum class Isa { kScalar, kAvx2, kAvx512 };
// Best instruction set this CPU supports (overridable with MILES_ISA=scalar|avx2|avx512).
Isa detect_isa();
const char* isa_name(Isa isa);

// A weight matrix W [N, K] (row-major, y = W x) repacked for the GEMM micro-kernels: panels of
// kPanel output columns, each stored k-major as [K][kPanel] floats (zero-padded past N). Packing
// only moves values (bf16 widened exactly), so it never changes results.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  static PackedMatrix pack(const Tensor& w);  // w: [N, K], f32 / bf16 / f16
  static PackedMatrix pack_f32(const float* w, int64_t n, int64_t k);
  // Rows of several matrices stacked as one [sum N_i, K] matrix (fused q/k/v, gate/up).
  static PackedMatrix pack_rows(const std::vector<const Tensor*>& parts);
  // pack_rows into this matrix, reusing its storage (a same-shaped repack allocates nothing); the
  // chunk goes back to gemm_chunk(K).
  void assign_rows(const std::vector<const Tensor*>& parts);
  // assign_rows, and t = the packed form of the stacked Wᵀ (as transpose_into) made in the same
  // pass over the source while its rows are in cache: a row of W is a run of kPanel floats in each
  // of t's panels. (Falls back to assign_rows + transpose_into for bf16/f16 parts or a K that is
  // not a multiple of kPanel.) Same values as the two calls.
  void assign_rows(const std::vector<const Tensor*>& parts, PackedMatrix& t);
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  // The K chunk length of this matrix's products: gemm_chunk(k()) unless set. A row-parallel shard
  // of a K_full matrix sets gemm_chunk(K_full) so that its chunks are the full product's chunks.
  int64_t chunk() const { return chunk_ > 0 ? chunk_ : gemm_chunk(k_); }
  void set_chunk(int64_t chunk);
  int64_t num_panels() const { return (n_ + kPanel - 1) / kPanel; }
  const float* panel(int64_t p) const { return data_.data() + p * k_ * kPanel; }
  // Row n of the original matrix (for tests and the embedding of tied weights).
  std::vector<float> unpack_row(int64_t row) const;
  // t = the packed form of Wᵀ [K, N] (the backward's d x = d y · W), reusing t's storage. Moves
  // values only.
  void transpose_into(PackedMatrix& t) const;
  // This matrix = the packed form of aᵀ for a row-major a[rows, cols] with row stride lda: a
  // [cols, rows] matrix whose reduction runs over a's rows (the backward's d W = d yᵀ · x). Reuses
  // its storage; the panels are spread over the pool.
  void assign_transposed(const float* a, int64_t rows, int64_t cols, int64_t lda, ThreadPool* pool);

 private:
  // An n × k shape, the chunk back to gemm_chunk(k), the panels sized (the caller writes every lane
  // of rows < n; the storage's capacity is kept).
  void reshape(int64_t n, int64_t k);
  void reshape_for(const std::vector<const Tensor*>& parts);  // stacked: they must share K
  void zero_padding_lanes();  // the last panel's lanes past n_ (rows that do not exist) = 0

  int64_t n_ = 0, k_ = 0;
  int64_t chunk_ = 0;        // 0: gemm_chunk(k_)
  LargeVector<float> data_;  // (num_panels, K, kPanel) first (reused storage may be longer)
};

// y[M, N] = x[M, K] · Wᵀ. x row stride lda (>= K), y row stride ldy (>= N).
void gemm(const float* x, int64_t m, int64_t lda, const PackedMatrix& w, float* y, int64_t ldy,
          ThreadPool* pool, Isa isa = detect_isa());
// gemm with x given transposed: xt [K, M] row-major (stride ldt >= M), so row i of the product's
// left operand is column i of xt (the backward's d W = d yᵀ · x without a transposed copy of d y).
// The same bits as gemm on the transposed copy.
// With `lefts`, each output is folded into pending partial sums as it is stored:
//   y = lefts[n-1] + (… + (lefts[1] + (lefts[0] + product)))
// element-wise, each left with y's shape and row stride (the last may be y itself): the trainer's
// halving tree over micro-batches, merged while a leaf's tile is still in registers.
using GemmLefts = std::span<const float* const>;
void gemm_xt(const float* xt, int64_t m, int64_t ldt, const PackedMatrix& w, float* y, int64_t ldy,
             ThreadPool* pool, Isa isa = detect_isa(), GemmLefts lefts = {});
// The definition of the numerics: one output element computed by the contract, scalar code
// (chunk 0: gemm_chunk(k)).
float gemm_reference_dot(const float* x, const float* w_row, int64_t k, int64_t chunk = 0);

// x[M, D] -> out[M, D] = x / sqrt(mean(x²) + eps) * weight. `out` may alias `x`.
void rmsnorm(const float* x, int64_t m, int64_t d, const float* weight, float eps, float* out);

// Rotary tables: inv_freq[rotary_dim / 2] and attention scaling, from a RopeConfig
// (model_config.h).
struct RopeTable {
  std::vector<float> inv_freq;  // (rotary_dim / 2)
  int64_t rotary_dim = 0;
  float attention_scaling = 1.0f;  // yarn multiplies cos and sin by it
  // cos and sin of positions [0, cached_positions), each times attention_scaling:
  // [position][cos | sin][rotary_dim / 2], the values rope_apply computes for later positions
  // (the same calls), looked up rather than recomputed for every token of every layer.
  std::vector<float> cos_sin;
  int64_t cached_positions = 0;
};
// The table for a config (HF's rope_init_fn for default, linear, llama3 and yarn, in float32).
// "dynamic" is refused: it makes a token's rotation depend on the sequence's current length, which
// breaks batch and chunked-prefill invariance.
Result<RopeTable> make_rope_table(const RopeConfig& rope, int64_t head_dim);
// x[T, H, head_dim] rotated in place, half-split pairs (i, i + rotary_dim/2) as HF's rotate_half;
// dims past rotary_dim are left as they are (partial rotary).
void rope_apply(float* x, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
                const RopeTable& table);

// out[M, F] = silu(gate) * up, gate/up rows with stride ld_in.
void swiglu(const float* gate, const float* up, int64_t m, int64_t f, int64_t ld_in, float* out);
// out[M, F] = gelu_tanh(gate) * up (GeGLU; torch's gelu(approximate="tanh"), tanh from miles' exp),
// gate/up rows with stride ld_in.
void geglu(const float* gate, const float* up, int64_t m, int64_t f, int64_t ld_in, float* out);

// In-place softmax / log-softmax of one row of n values.
void softmax_row(float* x, int64_t n);
void log_softmax_row(const float* x, int64_t n, float* out);
// log-sum-exp of a row, the normaliser used by log_softmax_row.
float logsumexp_row(const float* x, int64_t n);
// log_softmax_row(x)[i] alone (the same bits, no row written).
float log_softmax_at(const float* x, int64_t n, int64_t i);
// The row's normaliser as log_softmax_row computes it: out[i] = (x[i] - max) - log_sum.
struct LogSoftmaxStats {
  float max = 0.0f, log_sum = 0.0f;
};
LogSoftmaxStats log_softmax_stats(const float* x, int64_t n);
// log_softmax_row from stats already computed for this row (log_softmax_stats): the same bits.
void log_softmax_row(const float* x, int64_t n, const LogSoftmaxStats& stats, float* out);
// Both of a row at once, one exp per value: probs has softmax_row's bits and logp
// log_softmax_row's (the same max, the same exp terms summed in the same order).
void softmax_log_softmax_row(const float* x, int64_t n, float* probs, float* logp);

// Keys and values of one sequence for one layer, as a list of blocks of `block_tokens` positions
// (a paged KV cache hands its block table over). Inside a block, keys are [kv_heads][head_dim]
// [block_tokens] (each head's keys transposed, so attention scores 8 keys per vector straight from
// the cache when block_tokens is a multiple of 8) and values [kv_heads][block_tokens][head_dim].
// Positions past a sequence's last are never used; their contents do not matter.
struct KvSpan {
  std::span<const float* const> k_blocks;
  std::span<const float* const> v_blocks;
  int64_t block_tokens = 0;
};
// Stores one position's key and value (k, v: [kv_heads * head_dim]) at `slot` of its block.
void kv_block_store(const float* k, const float* v, int64_t slot, int64_t block_tokens,
                    int64_t kv_heads, int64_t head_dim, float* k_block, float* v_block);
// Causal attention with GQA for the queries q[T, H, hd] of one sequence at positions[T]: query t
// sees keys 0..positions[t], or with a sliding window W > 0 keys positions[t] − W + 1 ..
// positions[t] (transformers' sliding_window: key j visible when j > p − W). out[T, H, hd]. scale
// is usually 1/sqrt(hd).
void attention(const float* q, int64_t t, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const int32_t* positions, const KvSpan& kv, float scale, float* out,
               int64_t window = 0);
// The same with row strides: query i at q + i * ldq, its output at out + i * ldo. The queries of
// one call share each key block's transposition; a query's bits never depend on the others.
void attention(const float* q, int64_t ldq, int64_t t, int64_t heads, int64_t kv_heads,
               int64_t head_dim, const int32_t* positions, const KvSpan& kv, float scale,
               float* out, int64_t ldo, int64_t window = 0);

// out[T, D] = table[ids[t], :] for an f32 table [V, D].
void embedding(const float* table, int64_t d, const int32_t* ids, int64_t t, float* out);

// Indices of the k largest values, descending; ties broken by the lower index first.
void topk(const float* x, int64_t n, int64_t k, int32_t* idx_out, float* val_out);

}  // namespace miles::kernels
