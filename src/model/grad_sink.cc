// GradSink (grad_sink.h): scratch tensors, weight gradients stored folded, the final fold.
#include "miles/grad_sink.h"

#include <algorithm>
#include <unordered_map>

#include "miles/backward_kernels.h"
#include "miles/status.h"
#include "miles/thread_pool.h"
#include "model/elementwise.h"

namespace miles {

namespace {

constexpr int64_t kSlice = int64_t{1} << 18;  // floats per work item of the element-wise passes

// dest[i] = lefts[n-1][i] + (… + (lefts[0][i] + src[i])) for i < len; src null means zeros. dest
// may be lefts.back(): each block is read whole before it is written.
void fold_range(const float* src, const std::vector<const float*>& lefts, float* dest,
                int64_t len) {
  constexpr int64_t kBlock = 1024;
  float v[kBlock];
  for (int64_t b = 0; b < len; b += kBlock) {
    const int64_t n = std::min(kBlock, len - b);
    if (src) {
      std::copy_n(src + b, n, v);
    } else {
      std::fill_n(v, n, 0.0f);
    }
    for (const float* l : lefts)
      for (int64_t i = 0; i < n; ++i) v[i] = l[b + i] + v[i];
    std::copy_n(v, n, dest + b);
  }
}

void zero_fill(std::span<float> x, ThreadPool* pool) {
  const int64_t n = static_cast<int64_t>(x.size());
  parallel_for(n > kSlice ? pool : nullptr, (n + kSlice - 1) / kSlice, [&](int64_t b) {
    std::fill(x.data() + b * kSlice, x.data() + std::min(n, (b + 1) * kSlice), 0.0f);
  });
}

}  // namespace

GradSink::GradSink(FlatTensors& scratch, std::span<FlatTensors* const> fold, ThreadPool* pool)
    : scratch_(scratch),
      fold_(fold),
      pool_(pool),
      state_(scratch.layout().specs().size(), State::kUntouched) {
  for (const FlatTensors* f : fold)
    MILES_CHECK(f->layout().total() == scratch.layout().total(),
                "a gradient fold needs buffers of one layout");
}

size_t GradSink::index_of(const std::string& name) const {
  const ParamSpec& s = scratch_.layout().at(name);
  return static_cast<size_t>(&s - scratch_.layout().specs().data());
}

float* GradSink::accumulate(const std::string& name) {
  const size_t i = index_of(name);
  std::span<float> g = scratch_.get(name);
  if (state_[i] == State::kUntouched) zero_fill(g, pool_);
  MILES_CHECK(state_[i] != State::kStored, "a gradient stored by its GEMM is not accumulated");
  state_[i] = State::kScratch;
  return g.data();
}

float* GradSink::overwrite(const std::string& name) {
  const size_t i = index_of(name);
  MILES_CHECK(state_[i] != State::kStored, "a gradient stored by its GEMM is not overwritten");
  state_[i] = State::kScratch;
  return scratch_.get(name).data();
}

void GradSink::weight_grad(const float* dy, int64_t ldy, const float* x, int64_t ldx, int64_t m,
                           int64_t k, const std::vector<std::pair<std::string, int64_t>>& parts) {
  std::vector<std::vector<const float*>> lefts;  // per part, innermost first
  std::vector<kernels::WeightGradPart> out;
  lefts.reserve(parts.size());
  int64_t row = 0;
  for (const auto& [name, rows] : parts) {
    const size_t i = index_of(name);
    const ParamSpec& s = scratch_.layout().specs()[i];
    MILES_CHECK(s.numel == rows * k, "a weight gradient part's shape does not match its tensor");
    MILES_CHECK(state_[i] == State::kUntouched, "a weight gradient is stored once");
    state_[i] = State::kStored;
    std::vector<const float*>& l = lefts.emplace_back();
    for (FlatTensors* f : fold_) l.push_back(f->all().data() + s.offset);
    float* dest = (fold_.empty() ? scratch_.all().data() : fold_.back()->all().data()) + s.offset;
    out.push_back({row, rows, dest, l});
    row += rows;
  }
  kernels::gemm_weight_grad(dy, ldy, x, ldx, m, out, k, pool_);
}

void GradSink::scatter_rows(const std::string& name, std::span<const int64_t> rows,
                            const float* src, int64_t d) {
  const size_t t = index_of(name);
  // Not folding, or added to what is already there (the tied head's share written in place): the
  // rows go into the scratch, zero-filled on first use, and finish() folds it whole.
  if (fold_.empty() || state_[t] != State::kUntouched) {
    float* g = accumulate(name);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] >= 0) add_into(g + rows[i] * d, src + i * d, d);
    return;
  }
  state_[t] = State::kStored;
  const ParamSpec& spec = scratch_.layout().specs()[t];
  MILES_CHECK(spec.numel % d == 0, "a scattered gradient's rows do not match its tensor");
  // The touched rows' sums, in order of first appearance, each from zero in ascending token order.
  std::vector<int64_t> touched, slot(rows.size(), -1);
  std::unordered_map<int64_t, int64_t> where;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    MILES_CHECK(rows[i] * d < spec.numel, "a scattered row is outside its tensor");
    const auto [it, fresh] = where.emplace(rows[i], static_cast<int64_t>(touched.size()));
    if (fresh) touched.push_back(rows[i]);
    slot[i] = it->second;
  }
  std::vector<float> sums(touched.size() * d, 0.0f);
  for (size_t i = 0; i < rows.size(); ++i)
    if (slot[i] >= 0) add_into(sums.data() + slot[i] * d, src + i * d, d);
  // Touched rows folded first (the dense fold below overwrites fold_.back(), one of their lefts).
  std::vector<const float*> lefts(fold_.size());
  for (size_t u = 0; u < touched.size(); ++u) {
    for (size_t j = 0; j < fold_.size(); ++j)
      lefts[j] = fold_[j]->all().data() + spec.offset + touched[u] * d;
    fold_range(sums.data() + u * d, lefts, sums.data() + u * d, d);
  }
  float* dest = fold_.back()->all().data() + spec.offset;
  if (fold_.size() > 1) {  // the other rows: the lefts' own sum (with one left, dest is it)
    parallel_for(pool_, (spec.numel + kSlice - 1) / kSlice, [&](int64_t b) {
      std::vector<const float*> l;
      for (const FlatTensors* f : fold_) l.push_back(f->all().data() + spec.offset + b * kSlice);
      fold_range(nullptr, l, dest + b * kSlice, std::min(kSlice, spec.numel - b * kSlice));
    });
  }
  for (size_t u = 0; u < touched.size(); ++u)
    std::copy_n(sums.data() + u * d, d, dest + touched[u] * d);
}

void GradSink::finish() {
  // (offset, length, from scratch?) of every tensor still to settle, cut into slices.
  struct Job {
    int64_t offset, len;
    bool scratch;
  };
  std::vector<Job> jobs;
  const std::vector<ParamSpec>& specs = scratch_.layout().specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (state_[i] == State::kStored) continue;
    if (state_[i] == State::kScratch && fold_.empty()) continue;
    for (int64_t o = 0; o < specs[i].numel; o += kSlice)
      jobs.push_back({specs[i].offset + o, std::min(kSlice, specs[i].numel - o),
                      state_[i] == State::kScratch});
  }
  float* scratch = scratch_.all().data();
  float* dest = fold_.empty() ? scratch : fold_.back()->all().data();
  parallel_for(pool_, jobs.size(), [&](int64_t j) {
    const Job& job = jobs[j];
    std::vector<const float*> lefts;
    for (FlatTensors* f : fold_) lefts.push_back(f->all().data() + job.offset);
    fold_range(job.scratch ? scratch + job.offset : nullptr, lefts, dest + job.offset, job.len);
  });
  std::fill(state_.begin(), state_.end(), State::kStored);
}

void GradSink::fold_buffer(std::span<const float> scratch, std::span<const std::span<float>> lefts,
                           ThreadPool* pool) {
  if (lefts.empty()) return;
  const int64_t n = static_cast<int64_t>(scratch.size());
  for (const std::span<float>& l : lefts)
    MILES_CHECK(static_cast<int64_t>(l.size()) == n, "a folded buffer's size differs");
  parallel_for(pool, (n + kSlice - 1) / kSlice, [&](int64_t b) {
    const int64_t o = b * kSlice;
    std::vector<const float*> l;
    for (const std::span<float>& s : lefts) l.push_back(s.data() + o);
    fold_range(scratch.data() + o, l, lefts.back().data() + o, std::min(kSlice, n - o));
  });
}

}  // namespace miles
