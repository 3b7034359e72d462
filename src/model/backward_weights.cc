// Model::backward_weights: the transposed packs of every matrix (backward_weights.h), built on the
// first backward, one matrix per work item, and rebuilt in place by Model::reload_weights (as the
// weights are repacked: reload_model_weights).
#include "model/backward_weights.h"

#include <memory>
#include <utility>
#include <vector>

#include "miles/model.h"
#include "miles/status.h"
#include "miles/thread_pool.h"
#include "model/model_weights.h"

namespace miles {

namespace {

// Fills bw with the transposed packs of w's matrices, reusing bw's storage.
void build_backward_weights(const ModelWeights& w, BackwardWeights& bw, ThreadPool* pool) {
  bw.layers.resize(w.layers.size());
  // The LM head first: the largest job, started before the per-layer ones.
  std::vector<std::pair<const kernels::PackedMatrix*, kernels::PackedMatrix*>> jobs = {
      {&w.lm_head, &bw.lm_head_t}};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    LayerWeightsT& t = bw.layers[i];
    jobs.insert(jobs.end(), {{&l.qkv, &t.qkv_t}, {&l.o, &t.o_t}});
    if (!l.mla.kb_t.empty()) build_mla_backward(l.mla, t.mla);  // small: not worth a job
    if (!l.moe) {
      jobs.insert(jobs.end(), {{&l.gate_up, &t.gate_up_t}, {&l.down, &t.down_t}});
      continue;
    }
    jobs.push_back({&l.router, &t.router_t});
    t.experts.resize(l.experts.size());
    for (size_t e = 0; e < l.experts.size(); ++e) {
      jobs.push_back({&l.experts[e].gate_up, &t.experts[e].gate_up_t});
      jobs.push_back({&l.experts[e].down, &t.experts[e].down_t});
    }
    if (l.has_shared) {
      jobs.push_back({&l.shared.gate_up, &t.shared.gate_up_t});
      jobs.push_back({&l.shared.down, &t.shared.down_t});
    }
  }
  // Each job writes its own matrix; transposing only moves values.
  parallel_for(pool, jobs.size(),
               [&](int64_t j) { jobs[j].first->transpose_into(*jobs[j].second); });
}

}  // namespace

Status Model::reload_weights(const TensorMap& weights, ThreadPool* pool) {
  // Built already: kept current in the same pass over each matrix.
  MILES_RETURN_IF_ERROR(reload_model_weights(config_, weights, *w_, pool, bw_.get()));
  return Status::Ok();
}

const BackwardWeights& Model::backward_weights(ThreadPool* pool) const {
  std::call_once(backward_once_, [&] {
    auto bw = std::make_unique<BackwardWeights>();
    build_backward_weights(*w_, *bw, pool);
    bw_ = std::move(bw);
  });
  return *bw_;
}

}  // namespace miles
