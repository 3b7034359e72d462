// Attention's bits against its contract written out scalar, for every GQA group size the kernels
// treat differently (the group's heads are handled a few at a time, sharing key and value loads):
// the forward through the paged cache (prefill of a whole sequence, so every query sees several key
// blocks), and the backward (query blocks of 64, dk / dv summed over (block, head, query)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "miles/backward_kernels.h"
#include "kernels/exp.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"
#include "random_vec.h"

namespace miles::kernels {
namespace {

using test::random_vec;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The contract's dot: an fma chain over each chunk of kGemmChunk from its start, then the halving
// tree over the chunks (split [lo, hi) at lo + ceil((hi - lo) / 2)).
float contract_dot(const float* a, const float* b, int64_t n) {
  std::vector<float> parts;
  for (int64_t c = 0; c < n; c += kGemmChunk) {
    float acc = 0.0f;
    for (int64_t e = c; e < std::min(n, c + kGemmChunk); ++e) acc = std::fma(a[e], b[e], acc);
    parts.push_back(acc);
  }
  auto tree = [&](auto&& self, size_t lo, size_t hi) -> float {
    if (hi - lo == 1) return parts[lo];
    const size_t mid = lo + (hi - lo + 1) / 2;
    return self(self, lo, mid) + self(self, mid, hi);
  };
  return tree(tree, 0, parts.size());
}

struct Shape {
  int64_t heads, kv_heads, hd, t;
};

// Group sizes 1..7 (one head at a time, pairs, triples, fours and their remainders), head
// dimensions below one vector pass, at one, between and past one chunk (the scalar dot), and
// every width of the AVX-512 backward's key sums (16, 32, 48 and 64: one to four zmm per row).
std::vector<Shape> shapes() {
  return {{4, 4, 64, 70},  {6, 3, 64, 70}, {6, 2, 64, 150}, {8, 2, 64, 70},  {5, 1, 20, 70},
          {7, 1, 16, 40},  {6, 1, 8, 33},  {6, 2, 72, 70},  {4, 1, 160, 40}, {9, 3, 64, 1},
          {9, 3, 64, 129}, {2, 1, 24, 65}, {4, 2, 32, 70},  {3, 1, 48, 70}};
}

// Forward: per head and query, key blocks of kAttnBlock, scores scaled, online softmax, p · v by
// fma in ascending key order, then / denominator.
// With a sliding window W > 0, query i sees keys i − W + 1 .. i: the blocks before the window's
// are skipped, the keys before it in its first block score −inf.
std::vector<float> forward_contract(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const Shape& s, float scale,
                                    int64_t window = 0) {
  const int64_t hd = s.hd, group = s.heads / s.kv_heads;
  std::vector<float> out(s.t * s.heads * hd);
  for (int64_t i = 0; i < s.t; ++i)
    for (int64_t h = 0; h < s.heads; ++h) {
      const float* qh = q.data() + (i * s.heads + h) * hd;
      const int64_t off = (h / group) * hd;
      const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
      float mx = -INFINITY, den = 0.0f;
      std::vector<float> acc(hd, 0.0f);
      for (int64_t b0 = first / kAttnBlock * kAttnBlock; b0 <= i; b0 += kAttnBlock) {
        const int64_t n = std::min<int64_t>(kAttnBlock, i + 1 - b0);
        std::vector<float> sc(n);
        float bm = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          sc[j] = contract_dot(qh, k.data() + (b0 + j) * s.kv_heads * hd + off, hd) * scale;
          if (b0 + j < first) sc[j] = -INFINITY;
          bm = std::max(bm, sc[j]);
        }
        const float nm = std::max(mx, bm);
        const float alpha = std::isinf(mx) ? 0.0f : detail::exp_f32(mx - nm);
        den = den * alpha;
        for (auto& a : acc) a = a * alpha;
        for (int64_t j = 0; j < n; ++j) {
          const float p = detail::exp_f32(sc[j] - nm);
          den = den + p;
          const float* vj = v.data() + (b0 + j) * s.kv_heads * hd + off;
          for (int64_t e = 0; e < hd; ++e) acc[e] = std::fma(p, vj[e], acc[e]);
        }
        mx = nm;
      }
      for (int64_t e = 0; e < hd; ++e) out[(i * s.heads + h) * hd + e] = acc[e] / den;
    }
  return out;
}

// A sequence's keys and values stored in a paged cache of `bt`-position blocks (unused slots NaN)
// and its positions 0 .. t − 1.
struct PagedSequence {
  std::vector<std::vector<float>> kb, vb;
  std::vector<const float*> kp, vp;
  std::vector<int32_t> pos;
  int64_t bt;
  PagedSequence(const std::vector<float>& k, const std::vector<float>& v, const Shape& s,
                int64_t block_tokens)
      : bt(block_tokens) {
    const int64_t kvd = s.kv_heads * s.hd, blocks = (s.t + bt - 1) / bt;
    kb.assign(blocks, std::vector<float>(kvd * bt, std::nanf("")));
    vb = kb;
    for (int64_t j = 0; j < s.t; ++j)
      kv_block_store(k.data() + j * kvd, v.data() + j * kvd, j % bt, bt, s.kv_heads, s.hd,
                     kb[j / bt].data(), vb[j / bt].data());
    for (int64_t b = 0; b < blocks; ++b) {
      kp.push_back(kb[b].data());
      vp.push_back(vb[b].data());
    }
    for (int64_t i = 0; i < s.t; ++i) pos.push_back(static_cast<int32_t>(i));
  }
  KvSpan span() const { return KvSpan{kp, vp, bt}; }
};

// Forward through the paged cache, block sizes that hold whole 8-key segments (keys read in
// place) and that do not (12: keys gathered); unused cache slots hold NaN. The whole sequence as
// one prefill, and each query alone at its position (a decode step), give the contract's bits.
TEST(AttentionContract, ForwardOverThePagedCacheForEveryGroupSize) {
  for (const Shape& s : shapes())
    for (int64_t bt : {16, 12, 8, 64}) {
      const int64_t hd = s.hd, kvd = s.kv_heads * hd, qd = s.heads * hd;
      auto q = random_vec(s.t * qd, 11 + s.heads * 100 + hd);
      auto k = random_vec(s.t * kvd, 12 + hd), v = random_vec(s.t * kvd, 13 + hd);
      const PagedSequence paged(k, v, s, bt);
      const KvSpan span = paged.span();
      const std::vector<int32_t>& pos = paged.pos;
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const auto want = forward_contract(q, k, v, s, scale);
      const std::string what = "heads " + std::to_string(s.heads) + " kv " +
                               std::to_string(s.kv_heads) + " hd " + std::to_string(hd) + " t " +
                               std::to_string(s.t) + " bt " + std::to_string(bt);
      std::vector<float> got(s.t * qd);
      attention(q.data(), s.t, s.heads, s.kv_heads, hd, pos.data(), span, scale, got.data());
      EXPECT_TRUE(same_bits(got, want)) << "prefill, " << what;
      for (int64_t i = 0; i < s.t; ++i) {
        std::vector<float> one(qd);
        attention(q.data() + i * qd, 1, s.heads, s.kv_heads, hd, &pos[i], span, scale, one.data());
        ASSERT_TRUE(std::memcmp(one.data(), want.data() + i * qd, qd * 4) == 0)
            << "decode at " << i << ", " << what;
      }
    }
}

struct Grads {
  std::vector<float> dq, dk, dv;
};

// Backward: per kv head, per query block of 64: for each (head, query) the scores and dp = d_out ·
// v (contract dots), two-pass softmax, D = Σ fma(p, dp), ds = p (dp − D) scale, dq = Σ ds k in
// ascending key order; then per key dk += ds q and dv += p d_out over the block's (head, query)
// pairs in ascending (head, query) order.
Grads backward_contract(const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& d_out,
                        const Shape& s, float scale, int64_t window = 0) {
  const int64_t hd = s.hd, t = s.t, group = s.heads / s.kv_heads;
  const int64_t ldq = s.heads * hd, ldkv = s.kv_heads * hd, qb = 64;
  Grads g{std::vector<float>(t * ldq, 0.0f), std::vector<float>(t * ldkv, 0.0f),
          std::vector<float>(t * ldkv, 0.0f)};
  for (int64_t kh = 0; kh < s.kv_heads; ++kh)
    for (int64_t i0 = 0; i0 < t; i0 += qb) {
      const int64_t i1 = std::min(t, i0 + qb);
      // [head of group][query][key]
      std::vector<float> P(group * qb * t), DS(P.size());
      for (int64_t gi = 0; gi < group; ++gi)
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t h = kh * group + gi;
          const float* qi = q.data() + i * ldq + h * hd;
          const float* doi = d_out.data() + i * ldq + h * hd;
          float* p = P.data() + (gi * qb + i - i0) * t;
          float* ds = DS.data() + (gi * qb + i - i0) * t;
          std::vector<float> dp(i + 1);
          float mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = contract_dot(qi, k.data() + j * ldkv + kh * hd, hd) * scale;
            if (window > 0 && j < i - window + 1) p[j] = -INFINITY;  // before the window: p = 0
            dp[j] = contract_dot(doi, v.data() + j * ldkv + kh * hd, hd);
            mx = std::max(mx, p[j]);
          }
          float sum = 0.0f;
          for (int64_t j = 0; j <= i; ++j) sum = sum + (p[j] = detail::exp_f32(p[j] - mx));
          float dsum = 0.0f;
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = p[j] / sum;
            dsum = std::fma(p[j], dp[j], dsum);
          }
          for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (dp[j] - dsum) * scale;
          float* dqi = g.dq.data() + i * ldq + h * hd;
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t e = 0; e < hd; ++e)
              dqi[e] = std::fma(ds[j], k[j * ldkv + kh * hd + e], dqi[e]);
        }
      for (int64_t j = 0; j < i1; ++j)
        for (int64_t gi = 0; gi < group; ++gi)
          for (int64_t i = std::max(i0, j); i < i1; ++i) {
            const int64_t h = kh * group + gi, row = (gi * qb + i - i0) * t + j;
            for (int64_t e = 0; e < hd; ++e) {
              float& dkj = g.dk[j * ldkv + kh * hd + e];
              float& dvj = g.dv[j * ldkv + kh * hd + e];
              dkj = std::fma(DS[row], q[i * ldq + h * hd + e], dkj);
              dvj = std::fma(P[row], d_out[i * ldq + h * hd + e], dvj);
            }
          }
    }
  return g;
}

TEST(AttentionContract, BackwardForEveryGroupSize) {
  for (const Shape& s : shapes()) {
    const int64_t hd = s.hd, ldq = s.heads * hd, ldkv = s.kv_heads * hd;
    auto q = random_vec(s.t * ldq, 21 + hd), k = random_vec(s.t * ldkv, 22 + hd),
         v = random_vec(s.t * ldkv, 23 + hd), d_out = random_vec(s.t * ldq, 24 + s.heads);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    Grads got{std::vector<float>(s.t * ldq, 7.0f), std::vector<float>(s.t * ldkv, 7.0f),
              std::vector<float>(s.t * ldkv, 7.0f)};
    attention_backward(q.data(), k.data(), v.data(), ldq, ldkv, d_out.data(), s.t, s.heads,
                       s.kv_heads, hd, scale, got.dq.data(), got.dk.data(), got.dv.data());
    const Grads want = backward_contract(q, k, v, d_out, s, scale);
    const std::string what = "heads " + std::to_string(s.heads) + " kv " +
                             std::to_string(s.kv_heads) + " hd " + std::to_string(hd) + " t " +
                             std::to_string(s.t);
    EXPECT_TRUE(same_bits(got.dq, want.dq)) << "dq, " << what;
    EXPECT_TRUE(same_bits(got.dk, want.dk)) << "dk, " << what;
    EXPECT_TRUE(same_bits(got.dv, want.dv)) << "dv, " << what;
  }
}

// Sliding windows (Mistral): narrower than a key block, a block's width, one key more, and wider
// than two blocks. The forward through the paged cache (prefill and each query alone) and the
// backward give the contract's bits, and the forward is the window's softmax (double precision,
// within 1e-5): keys before the window do not count.
TEST(AttentionContract, SlidingWindowForwardAndBackward) {
  const Shape s{6, 2, 64, 150};
  const int64_t hd = s.hd, kvd = s.kv_heads * hd, qd = s.heads * hd, bt = 16;
  auto q = random_vec(s.t * qd, 31), k = random_vec(s.t * kvd, 32), v = random_vec(s.t * kvd, 33);
  auto d_out = random_vec(s.t * qd, 34);
  const PagedSequence paged(k, v, s, bt);
  const KvSpan span = paged.span();
  const std::vector<int32_t>& pos = paged.pos;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t window : {1, 5, 32, 33, 70}) {
    const std::string what = "window " + std::to_string(window);
    const auto want = forward_contract(q, k, v, s, scale, window);
    std::vector<float> got(s.t * qd);
    attention(q.data(), s.t, s.heads, s.kv_heads, hd, pos.data(), span, scale, got.data(), window);
    EXPECT_TRUE(same_bits(got, want)) << "prefill, " << what;
    for (int64_t i = 0; i < s.t; i += 7) {
      std::vector<float> one(qd);
      attention(q.data() + i * qd, 1, s.heads, s.kv_heads, hd, &pos[i], span, scale, one.data(),
                window);
      ASSERT_TRUE(std::memcmp(one.data(), want.data() + i * qd, qd * 4) == 0)
          << "decode at " << i << ", " << what;
    }
    double worst = 0;  // the window's softmax in double precision
    for (int64_t i = 0; i < s.t; ++i)
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t kh = h / (s.heads / s.kv_heads), first = std::max<int64_t>(0, i - window + 1);
        std::vector<double> w;
        double mx = -1e300, den = 0;
        for (int64_t j = first; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e)
            d += static_cast<double>(q[i * qd + h * hd + e]) * k[j * kvd + kh * hd + e];
          w.push_back(d * scale);
          mx = std::max(mx, w.back());
        }
        for (double& x : w) den += (x = std::exp(x - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = first; j <= i; ++j) o += w[j - first] / den * v[j * kvd + kh * hd + e];
          worst = std::max(worst, std::fabs(o - got[i * qd + h * hd + e]));
        }
      }
    EXPECT_LT(worst, 1e-5) << what;
    Grads g{std::vector<float>(s.t * qd), std::vector<float>(s.t * kvd),
            std::vector<float>(s.t * kvd)};
    attention_backward(q.data(), k.data(), v.data(), qd, kvd, d_out.data(), s.t, s.heads,
                       s.kv_heads, hd, scale, g.dq.data(), g.dk.data(), g.dv.data(), window);
    const Grads gw = backward_contract(q, k, v, d_out, s, scale, window);
    EXPECT_TRUE(same_bits(g.dq, gw.dq)) << "dq, " << what;
    EXPECT_TRUE(same_bits(g.dk, gw.dk)) << "dk, " << what;
    EXPECT_TRUE(same_bits(g.dv, gw.dv)) << "dv, " << what;
  }
}

// The batched backward over the pool: sequences of a packed batch, one long enough that its
// query blocks' P and dS take two windows (the window boundary inside one kv head), each equal to
// the contract whatever the thread count.
TEST(AttentionContract, BatchedBackwardOverThreadsAndWindows) {
  const int64_t heads = 6, kvh = 2, hd = 8, ldq = heads * hd, ldkv = kvh * hd;
  const std::vector<int64_t> lens = {70, 1, 1100, 129};
  int64_t total = 0;
  for (const int64_t t : lens) total += t;
  auto q = random_vec(total * ldq, 41), k = random_vec(total * ldkv, 42),
       v = random_vec(total * ldkv, 43), d_out = random_vec(total * ldq, 44);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<Grads> want;
  for (int64_t s = 0, off = 0; s < static_cast<int64_t>(lens.size()); off += lens[s++]) {
    const int64_t t = lens[s];
    auto part = [&](const std::vector<float>& x, int64_t ld) {
      return std::vector<float>(x.begin() + off * ld, x.begin() + (off + t) * ld);
    };
    want.push_back(backward_contract(part(q, ldq), part(k, ldkv), part(v, ldkv), part(d_out, ldq),
                                     Shape{heads, kvh, hd, t}, scale));
  }
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    Grads got{std::vector<float>(total * ldq, 7.0f), std::vector<float>(total * ldkv, 7.0f),
              std::vector<float>(total * ldkv, 7.0f)};
    std::vector<AttentionSeq> seqs;
    for (int64_t s = 0, off = 0; s < static_cast<int64_t>(lens.size()); off += lens[s++])
      seqs.push_back({q.data() + off * ldq, k.data() + off * ldkv, v.data() + off * ldkv,
                      d_out.data() + off * ldq, got.dq.data() + off * ldq,
                      got.dk.data() + off * ldkv, got.dv.data() + off * ldkv, lens[s]});
    attention_backward_batch(seqs, ldq, ldkv, heads, kvh, hd, scale, threads > 1 ? &pool : nullptr);
    for (int64_t s = 0, off = 0; s < static_cast<int64_t>(lens.size()); off += lens[s++]) {
      const int64_t t = lens[s];
      const std::string what =
          "sequence " + std::to_string(s) + ", threads " + std::to_string(threads);
      EXPECT_TRUE(same_bits(
          std::vector<float>(got.dq.begin() + off * ldq, got.dq.begin() + (off + t) * ldq),
          want[s].dq))
          << "dq, " << what;
      EXPECT_TRUE(same_bits(
          std::vector<float>(got.dk.begin() + off * ldkv, got.dk.begin() + (off + t) * ldkv),
          want[s].dk))
          << "dk, " << what;
      EXPECT_TRUE(same_bits(
          std::vector<float>(got.dv.begin() + off * ldkv, got.dv.begin() + (off + t) * ldkv),
          want[s].dv))
          << "dv, " << what;
    }
  }
}

}  // namespace
}  // namespace miles::kernels
