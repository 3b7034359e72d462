// DraftHead (draft_head.h): fc over [embedding; feature] → a one-layer Model of the policy's family
// whose head is the policy's rows of the draft vocabulary. Training reuses Model::forward's tape
// and Model::backward (the fused inputs given as input_hidden); only fc's product is written here.
#include "miles/draft_head.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "miles/backward_kernels.h"
#include "miles/kernels.h"
#include "miles/thread_pool.h"

namespace miles {

namespace {

constexpr const char* kFc = "draft.fc.weight";
constexpr const char* kFeatFc = "draft.feature_fc.weight";
constexpr const char* kVocab = "draft.vocab";
constexpr const char* kLayers = "draft.feature_layers";
const std::string kLayerPrefix = "model.layers.0.";
const std::string kDraftPrefix = "draft.layers.0.";

// The draft Model's config: the policy's family, one layer, the draft vocabulary, untied.
Result<ModelConfig> draft_config(const ModelConfig& policy, int64_t vocab) {
  if (policy.is_mla() || policy.num_moe_layers() > 0)
    return Status::Error("draft head: the policy (" + policy.arch_name +
                         ") has MoE or MLA layers; the draft head supports dense families only");
  ModelConfig c = policy;
  c.num_layers = 1;
  c.vocab_size = vocab;
  c.tie_word_embeddings = false;
  if (!c.sliding_layers.empty()) c.sliding_layers = {policy.sliding_layers[0]};
  c.bos_token_id = 0;
  c.eos_token_ids.clear();
  return c;
}

Status check_vocab(const std::vector<int32_t>& vocab, int64_t policy_vocab) {
  if (vocab.size() < 2) return Status::Error("draft head: the draft vocabulary needs >= 2 ids");
  std::vector<int32_t> sorted = vocab;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= policy_vocab)
      return Status::Error("draft head: vocabulary id " + std::to_string(sorted[i]) +
                           " is outside the policy's [0, " + std::to_string(policy_vocab) + ")");
    if (i > 0 && sorted[i] == sorted[i - 1])
      return Status::Error("draft head: vocabulary id " + std::to_string(sorted[i]) +
                           " is repeated");
  }
  return Status::Ok();
}

Tensor f32_view(std::vector<int64_t> shape, const float* data) {
  return Tensor::view(DType::kF32, std::move(shape), data, nullptr);
}

}  // namespace

std::vector<int32_t> top_ids(std::span<const uint64_t> counts, int64_t size) {
  std::vector<int32_t> ids(counts.size());
  std::iota(ids.begin(), ids.end(), 0);
  size = std::min<int64_t>(size, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + size, ids.end(), [&](int32_t a, int32_t b) {
    return counts[a] != counts[b] ? counts[a] > counts[b] : a < b;
  });
  ids.resize(static_cast<size_t>(size));
  std::sort(ids.begin(), ids.end());
  return ids;
}

DraftHead::~DraftHead() = default;

Result<std::vector<int64_t>> DraftHead::feature_layers_for(const ModelConfig& policy,
                                                           std::span<const int64_t> layers) {
  if (layers.empty()) return std::vector<int64_t>{policy.num_layers - 1};
  if (static_cast<int64_t>(layers.size()) > kMaxFeatureLayers)
    return Status::Error("draft head: " + std::to_string(layers.size()) +
                         " feature layers; at most " + std::to_string(kMaxFeatureLayers));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < 0 || layers[i] >= policy.num_layers)
      return Status::Error("draft head: feature layer " + std::to_string(layers[i]) +
                           " is outside the policy's layers [0, " +
                           std::to_string(policy.num_layers) + ")");
    if (i > 0 && layers[i] <= layers[i - 1])
      return Status::Error("draft head: feature layers must be ascending and distinct (" +
                           std::to_string(layers[i]) + " after " + std::to_string(layers[i - 1]) +
                           ")");
  }
  return std::vector<int64_t>(layers.begin(), layers.end());
}

Result<std::shared_ptr<const ParamLayout>> DraftHead::layout_for(
    const ModelConfig& policy, std::span<const int64_t> feature_layers) {
  MILES_ASSIGN_OR_RETURN(ModelConfig c, draft_config(policy, 2));
  MILES_ASSIGN_OR_RETURN(const std::vector<int64_t> layers,
                         feature_layers_for(policy, feature_layers));
  std::vector<ParamSpec> specs;
  ParamSpec fc;
  fc.name = kFc;
  fc.shape = {policy.hidden_size, 2 * policy.hidden_size};
  specs.push_back(fc);
  if (layers.size() > 1) {
    ParamSpec p;
    p.name = kFeatFc;
    p.shape = {policy.hidden_size, static_cast<int64_t>(layers.size()) * policy.hidden_size};
    specs.push_back(p);
  }
  const std::shared_ptr<const ParamLayout> model_layout = ParamLayout::for_model(c);
  for (const ParamSpec& s : model_layout->specs()) {
    if (s.name.rfind(kLayerPrefix, 0) != 0) continue;
    ParamSpec d = s;
    d.name = kDraftPrefix + s.name.substr(kLayerPrefix.size());
    specs.push_back(d);
  }
  return ParamLayout::of(specs);
}

Result<std::unique_ptr<DraftHead>> DraftHead::create(const ModelConfig& policy,
                                                     const TensorMap& policy_weights,
                                                     std::vector<int32_t> vocab,
                                                     std::span<const int64_t> feature_layers) {
  MILES_ASSIGN_OR_RETURN(const std::vector<int64_t> layers,
                         feature_layers_for(policy, feature_layers));
  MILES_ASSIGN_OR_RETURN(std::shared_ptr<const ParamLayout> layout, layout_for(policy, layers));
  FlatTensors init(layout);
  const int64_t d = policy.hidden_size, k = layers.size();
  std::span<float> fc = init.get(kFc);
  for (int64_t i = 0; i < d; ++i) fc[i * 2 * d + i] = 1.0f;  // u = embedding
  if (k > 1) {  // P = [0 … 0 | I]: the last feature layer alone
    std::span<float> p = init.get(kFeatFc);
    for (int64_t i = 0; i < d; ++i) p[i * k * d + (k - 1) * d + i] = 1.0f;
  }
  for (const ParamSpec& s : layout->specs()) {
    if (s.name == kFc || s.name == kFeatFc) continue;
    const std::string src = kLayerPrefix + s.name.substr(kDraftPrefix.size());
    MILES_ASSIGN_OR_RETURN(Tensor t, policy_weights.get(src, s.shape));
    const std::vector<float> v = t.to_f32();
    std::copy(v.begin(), v.end(), init.get(s.name).begin());
  }
  TensorMap draft = init.as_tensor_map();
  const std::vector<int32_t> ids(layers.begin(), layers.end());
  draft.insert(kLayers, Tensor::view(DType::kI32, {k}, ids.data(), nullptr), "draft head");
  return from_weights(policy, policy_weights, draft, std::move(vocab));
}

Result<std::unique_ptr<DraftHead>> DraftHead::from_weights(const ModelConfig& policy,
                                                           const TensorMap& policy_weights,
                                                           const TensorMap& draft,
                                                           std::vector<int32_t> vocab) {
  MILES_RETURN_IF_ERROR(check_vocab(vocab, policy.vocab_size));
  std::vector<int64_t> given;
  if (const Tensor* l = draft.find(kLayers)) {
    if (l->dtype() != DType::kI32 || l->ndim() != 1)
      return Status::Error(std::string("draft head: ") + kLayers + " is not an int32 vector");
    given.assign(l->data<int32_t>(), l->data<int32_t>() + l->numel());
    if (given.empty()) return Status::Error(std::string("draft head: ") + kLayers + " is empty");
  }
  std::unique_ptr<DraftHead> h(new DraftHead());
  MILES_ASSIGN_OR_RETURN(h->layers_, feature_layers_for(policy, given));
  if (h->layers_.size() == 1 && draft.find(kFeatFc))
    return Status::Error(std::string("draft head: ") + kFeatFc +
                         " without a list of several feature layers (" + kLayers + ")");
  h->layer_ids_.assign(h->layers_.begin(), h->layers_.end());
  MILES_ASSIGN_OR_RETURN(std::shared_ptr<const ParamLayout> layout, layout_for(policy, h->layers_));
  h->policy_ = policy;
  MILES_ASSIGN_OR_RETURN(h->config_, draft_config(policy, vocab.size()));
  h->vocab_ = std::move(vocab);
  MILES_ASSIGN_OR_RETURN(h->params_, FlatTensors::from_tensor_map(layout, draft));
  MILES_RETURN_IF_ERROR(h->set_policy(policy_weights));
  return h;
}

Status DraftHead::set_policy(const TensorMap& policy_weights) {
  const int64_t v = policy_.vocab_size, d = policy_.hidden_size;
  MILES_ASSIGN_OR_RETURN(Tensor embed, policy_weights.get("model.embed_tokens.weight", {v, d}));
  MILES_ASSIGN_OR_RETURN(Tensor norm, policy_weights.get("model.norm.weight", {d}));
  embed.to_f32(embed_);
  norm.to_f32(final_norm_);
  // Each feature layer's norm as the policy's next step applies it (Gemma's 1 + weight).
  const auto as_applied = [&](std::vector<float> w) {
    if (policy_.norm_adds_one())
      for (float& x : w) x = 1.0f + x;
    return w;
  };
  own_norm_ = as_applied(final_norm_);
  tap_norms_.clear();
  for (const int64_t l : layers_) {
    if (l == policy_.num_layers - 1) {
      tap_norms_.insert(tap_norms_.end(), own_norm_.begin(), own_norm_.end());
      continue;
    }
    const std::string name = "model.layers." + std::to_string(l + 1) + ".input_layernorm.weight";
    MILES_ASSIGN_OR_RETURN(Tensor next, policy_weights.get(name, {d}));
    const std::vector<float> w = as_applied(next.to_f32());
    tap_norms_.insert(tap_norms_.end(), w.begin(), w.end());
  }
  if (policy_.tie_word_embeddings) {
    head_.clear();
  } else {
    MILES_ASSIGN_OR_RETURN(Tensor head, policy_weights.get("lm_head.weight", {v, d}));
    head.to_f32(head_);
  }
  return rebuild();
}

Status DraftHead::set_vocab(std::vector<int32_t> vocab) {
  if (vocab.size() != vocab_.size())
    return Status::Error("draft head: a new vocabulary of " + std::to_string(vocab.size()) +
                         " ids for a head of " + std::to_string(vocab_.size()));
  MILES_RETURN_IF_ERROR(check_vocab(vocab, policy_.vocab_size));
  vocab_ = std::move(vocab);
  return rebuild();
}

Status DraftHead::set_params(const FlatTensors& params) {
  if (params.layout().total() != params_.layout().total())
    return Status::Error("draft head: parameters of another layout");
  std::copy(params.all().begin(), params.all().end(), params_.all().begin());
  return rebuild();
}

Status DraftHead::set_params(const TensorMap& draft) {
  MILES_ASSIGN_OR_RETURN(FlatTensors p, FlatTensors::from_tensor_map(params_.layout_ptr(), draft));
  params_ = std::move(p);
  return rebuild();
}

TensorMap DraftHead::as_tensor_map() const {
  TensorMap m = params_.as_tensor_map();
  m.insert(kVocab,
           Tensor::view(DType::kI32, {static_cast<int64_t>(vocab_.size())}, vocab_.data(), nullptr),
           "draft head");
  m.insert(kLayers,
           Tensor::view(DType::kI32, {static_cast<int64_t>(layer_ids_.size())}, layer_ids_.data(),
                        nullptr),
           "draft head");
  return m;
}

Status DraftHead::rebuild() {
  const int64_t d = policy_.hidden_size, n = vocab_.size(), k = layers_.size();
  fc_packed_ = kernels::PackedMatrix::pack_f32(params_.get(kFc).data(), d, 2 * d);
  if (k > 1) feat_packed_ = kernels::PackedMatrix::pack_f32(params_.get(kFeatFc).data(), d, k * d);
  const std::vector<float>& head = policy_.tie_word_embeddings ? embed_ : head_;
  std::vector<float> rows(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i) std::copy_n(head.data() + vocab_[i] * d, d, rows.data() + i * d);
  TensorMap w;
  w.insert("model.embed_tokens.weight", f32_view({n, d}, rows.data()), "draft head");
  w.insert("lm_head.weight", f32_view({n, d}, rows.data()), "draft head");
  w.insert("model.norm.weight", f32_view({d}, final_norm_.data()), "draft head");
  for (const ParamSpec& s : params_.layout().specs()) {
    if (s.name == kFc || s.name == kFeatFc) continue;
    w.insert(kLayerPrefix + s.name.substr(kDraftPrefix.size()),
             f32_view(s.shape, params_.get(s.name).data()), "draft head");
  }
  if (model_) return model_->reload_weights(w);
  MILES_ASSIGN_OR_RETURN(model_, Model::from_weights(config_, w));
  return Status::Ok();
}

void DraftHead::fuse(std::span<const float> features, std::span<const int32_t> next_ids, int64_t n,
                     bool own, std::vector<float>& x, std::vector<float>& z, std::vector<float>& u,
                     ThreadPool* pool) const {
  const int64_t d = policy_.hidden_size, k = own ? 1 : static_cast<int64_t>(layers_.size());
  const float scale = policy_.embed_scale();
  const float eps = static_cast<float>(policy_.rms_norm_eps);
  x.resize(static_cast<size_t>(n * 2 * d));
  if (k > 1) z.resize(static_cast<size_t>(n * k * d));
  for (int64_t i = 0; i < n; ++i) {
    const float* e = embed_.data() + static_cast<int64_t>(next_ids[i]) * d;
    float* row = x.data() + i * 2 * d;
    for (int64_t j = 0; j < d; ++j) row[j] = e[j] * scale;
    // Each feature as the policy's next step sees it (its norm): the residual stream's scale varies
    // by orders of magnitude across dimensions, which would make fc's updates explode.
    if (k == 1) {
      kernels::rmsnorm(features.data() + i * d, 1, d, own ? own_norm_.data() : tap_norms_.data(),
                       eps, row + d);
      continue;
    }
    for (int64_t l = 0; l < k; ++l)
      kernels::rmsnorm(features.data() + (i * k + l) * d, 1, d, tap_norms_.data() + l * d, eps,
                       z.data() + (i * k + l) * d);
  }
  if (k > 1)  // the feature half of x = P · z
    kernels::gemm(z.data(), n, k * d, feat_packed_, x.data() + d, 2 * d, pool);
  u.resize(static_cast<size_t>(n * d));
  kernels::gemm(x.data(), n, 2 * d, fc_packed_, u.data(), d, pool);
}

std::unique_ptr<SimpleKvCache> DraftHead::make_kv_cache() const { return model_->make_kv_cache(); }

Result<DraftStep> DraftHead::forward(std::span<const float> features,
                                     std::span<const int32_t> next_ids,
                                     std::span<const SeqSpan> seqs, KvStore& kv, ThreadPool* pool,
                                     bool own) const {
  const int64_t d = policy_.hidden_size, n = next_ids.size();
  const int64_t width = own ? d : feature_width();
  if (static_cast<int64_t>(features.size()) != n * width)
    return Status::Error("draft head: " + std::to_string(features.size()) + " feature values for " +
                         std::to_string(n) + " rows of " + std::to_string(width));
  for (int32_t id : next_ids)
    if (id < 0 || id >= policy_.vocab_size)
      return Status::Error("draft head: token id " + std::to_string(id) +
                           " is outside the vocabulary");
  std::vector<float> x, z, u;
  fuse(features, next_ids, n, own, x, z, u, pool);
  const std::vector<int32_t> dummy(static_cast<size_t>(n), 0);
  ForwardOptions opt;
  opt.all_logits = false;
  opt.input_hidden = u;
  opt.return_hidden = true;
  MILES_ASSIGN_OR_RETURN(ForwardOutput out, model_->forward(dummy, seqs, kv, opt, pool));
  DraftStep step;
  step.logits = std::move(out.logits);
  step.hidden.resize(seqs.size() * d);
  int64_t end = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    end += seqs[s].n_tokens;
    std::copy_n(out.hidden.data() + (end - 1) * d, d, step.hidden.data() + s * d);
  }
  return step;
}

Result<DraftTrainSums> DraftHead::accumulate_grad(const DraftTrainRows& rows, double scale,
                                                  FlatTensors& grads, ThreadPool* pool,
                                                  int64_t passes) const {
  if (passes < 1 || passes > kMaxPasses)
    return Status::Error("draft head: " + std::to_string(passes) + " training passes; 1 to " +
                         std::to_string(kMaxPasses));
  const int64_t d = policy_.hidden_size, pv = policy_.vocab_size;
  const int64_t t = rows.tokens.size(), width = feature_width();
  if (grads.layout().total() != params_.layout().total())
    return Status::Error("draft head: a gradient buffer of another layout");
  const bool mapped = !rows.logit_row.empty();
  const int64_t logit_rows = mapped ? static_cast<int64_t>(rows.logits.size()) / pv : t;
  if (static_cast<int64_t>(rows.features.size()) != t * width ||
      static_cast<int64_t>(rows.logits.size()) != logit_rows * pv ||
      static_cast<int64_t>(rows.weight.size()) != t ||
      (mapped && static_cast<int64_t>(rows.logit_row.size()) != t))
    return Status::Error("draft head: features, logits and weights do not match " +
                         std::to_string(t) + " tokens");
  // Token row i's policy logits, or null where it has none.
  const auto policy_row = [&](int64_t i) -> const float* {
    const int64_t r = mapped ? rows.logit_row[i] : i;
    return r < 0 ? nullptr : rows.logits.data() + r * pv;
  };
  for (int64_t i = 0; i < t; ++i) {
    if (mapped && (rows.logit_row[i] < -1 || rows.logit_row[i] >= logit_rows))
      return Status::Error("draft head: token row " + std::to_string(i) + " maps to logits row " +
                           std::to_string(rows.logit_row[i]) + " of " + std::to_string(logit_rows));
    if (rows.weight[i] != 0 && policy_row(i) == nullptr)
      return Status::Error("draft head: token row " + std::to_string(i) +
                           " has a weight and no logits");
  }
  // Draft row j of a sequence: feature j, next id j + 1, target the policy's row j + 1.
  std::vector<SeqSpan> seqs;
  std::vector<int64_t> src;  // policy row of each draft row's feature
  std::vector<int64_t> at_pos;  // each draft row's position j in its sequence
  int64_t at = 0;
  for (const SeqSpan& s : rows.seqs) {
    if (s.start_pos != 0 || s.n_tokens < 1)
      return Status::Error("draft head: training needs whole sequences");
    if (s.n_tokens >= 2)  // a one-token sequence has no draft row
      seqs.push_back({static_cast<int32_t>(seqs.size()), 0, s.n_tokens - 1});
    for (int64_t j = 0; j + 1 < s.n_tokens; ++j) {
      src.push_back(at + j);
      at_pos.push_back(j);
    }
    at += s.n_tokens;
  }
  if (at != t) return Status::Error("draft head: sequences do not cover the batch");
  const int64_t n = src.size();
  if (n == 0) return DraftTrainSums{};
  std::vector<Pass> ps(static_cast<size_t>(passes));
  ps[0].feat.resize(static_cast<size_t>(n * width));
  std::vector<int32_t> next(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(rows.features.data() + src[r] * width, width, ps[0].feat.data() + r * width);
    next[r] = rows.tokens[src[r] + 1];
  }
  // Each weighted row's policy numbers, once for every pass.
  std::vector<PolicyTarget> target(static_cast<size_t>(n));
  parallel_ranges(pool, n, 4 * pv, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (rows.weight[src[r] + 1] == 0) continue;
      const float* pz = policy_row(src[r] + 1);
      PolicyTarget& t = target[r];
      t.full = kernels::log_softmax_stats(pz, pv);
      for (int64_t i = 1; i < pv; ++i)
        if (pz[i] > pz[t.best]) t.best = i;
      for (const int32_t id : vocab_) t.in_vocab += std::exp(pz[id] - t.full.max - t.full.log_sum);
    }
  });
  const PassRows pr{seqs, src, at_pos, next, policy_row, rows.weight, scale, target};
  // Forwards first, pass 1 to the last, each reading the previous pass's g; then the backwards,
  // last pass first, each sending the previous pass d g and its tapes d keys / d values.
  DraftTrainSums sums;
  for (int64_t p = 1; p <= passes; ++p) {
    if (p > 1) {  // row j reads g of row j − 1 (the head's own feature for the token it drafted)
      std::vector<float>& feat = ps[p - 1].feat;
      const std::vector<float>& g = ps[p - 2].g;
      feat.assign(static_cast<size_t>(n * d), 0.0f);
      for (int64_t r = 0; r < n; ++r)
        if (at_pos[r] > 0) std::copy_n(g.data() + (r - 1) * d, d, feat.data() + r * d);
    }
    MILES_ASSIGN_OR_RETURN(DraftTrainSums s, forward_pass(pr, p, ps, p == passes, pool));
    if (p == 1)
      sums = s;
    else
      sums.ahead.push_back(s);
  }
  std::vector<float> dg;
  for (int64_t p = passes; p >= 1; --p)
    MILES_RETURN_IF_ERROR(backward_pass(pr, p, ps, dg, grads, pool));
  return sums;
}

Result<DraftTrainSums> DraftHead::forward_pass(const PassRows& pr, int64_t pass,
                                               std::vector<Pass>& passes, bool last,
                                               ThreadPool* pool) const {
  const int64_t dv = vocab_.size();
  const int64_t n = pr.src.size();
  Pass& ps = passes[pass - 1];
  std::vector<float> u;
  fuse(ps.feat, pr.next, n, pass > 1, ps.x, ps.z, u, pool);

  // The rows with a loss: pass p's first p − 1 rows of a sequence have no drafted feature to read
  // (weight 0). The LM head runs on those rows only (ForwardOptions::logit_rows): the others would
  // get zero d logits, and the head's own weight gradient, which their rows would change, is not
  // trained (the policy's frozen rows).
  std::vector<float> w_live;
  for (int64_t r = 0; r < n; ++r) {
    const float w = pr.at_pos[r] + 1 >= pass ? pr.weight[pr.src[r] + 1] : 0.0f;
    if (w == 0) continue;
    ps.live.push_back(r);
    w_live.push_back(w);
  }
  // Pass p's rows read the keys of passes 1 .. p − 1 (ForwardOptions::earlier_passes).
  std::vector<const ForwardTape*> earlier;
  for (int64_t q = 0; q + 1 < pass; ++q) earlier.push_back(passes[q].tape.get());
  ps.tape = std::make_unique<ForwardTape>();
  auto kv = model_->make_kv_cache();
  ForwardOptions opt;
  opt.tape = ps.tape.get();
  opt.earlier_passes = earlier;
  opt.input_hidden = u;
  opt.return_hidden = !last;
  const std::vector<int64_t> first{0};
  opt.logit_rows = ps.live.empty() ? std::span<const int64_t>(first) : ps.live;
  const std::vector<int32_t> dummy(static_cast<size_t>(n), 0);
  MILES_ASSIGN_OR_RETURN(ForwardOutput out, model_->forward(dummy, pr.seqs, *kv, opt, pool));
  ps.g = std::move(out.hidden);
  if (ps.live.empty()) return DraftTrainSums{};  // nothing to fit; g was all the next pass needs

  // Soft cross-entropy per live row against the policy's distribution renormalised over the draft
  // vocabulary; d logits overwrite the draft's logits in place.
  const int64_t m = ps.live.size();
  std::vector<double> loss(m), agree(m), accept(m), mass(m);
  parallel_ranges(pool, m, 8 * dv, [&](int64_t r0, int64_t r1) {
    std::vector<float> q(static_cast<size_t>(dv)), p(static_cast<size_t>(dv)),
        logp(static_cast<size_t>(dv));
    for (int64_t r = r0; r < r1; ++r) {
      float* z = out.logits.data() + r * dv;
      const float* pz = pr.policy_row(pr.src[ps.live[r]] + 1);
      const PolicyTarget& t = pr.target[ps.live[r]];
      for (int64_t i = 0; i < dv; ++i) q[i] = pz[vocab_[i]];
      kernels::softmax_row(q.data(), dv);  // the target over the draft vocabulary
      kernels::softmax_log_softmax_row(z, dv, p.data(), logp.data());
      double l = 0;
      int64_t best = 0;
      for (int64_t i = 0; i < dv; ++i) {
        l -= static_cast<double>(q[i]) * logp[i];
        if (z[i] > z[best]) best = i;
      }
      loss[r] = l;
      agree[r] = vocab_[best] == t.best ? 1.0 : 0.0;
      accept[r] = std::exp(pz[vocab_[best]] - t.full.max - t.full.log_sum);
      mass[r] = t.in_vocab;
      const float gs = static_cast<float>(pr.scale * w_live[r]);
      for (int64_t i = 0; i < dv; ++i) z[i] = gs * (p[i] - q[i]);
    }
  });
  ps.d_logits = std::move(out.logits);
  DraftTrainSums sums;
  for (int64_t r = 0; r < m; ++r) {
    const double w = w_live[r];
    sums.rows += w;
    sums.loss += w * loss[r];
    sums.agree += w * agree[r];
    sums.accept += w * accept[r];
    sums.in_vocab += w * mass[r];
  }
  return sums;
}

Status DraftHead::backward_pass(const PassRows& pr, int64_t pass, std::vector<Pass>& passes,
                                std::vector<float>& dg, FlatTensors& grads,
                                ThreadPool* pool) const {
  const int64_t d = policy_.hidden_size, n = pr.src.size();
  Pass& ps = passes[pass - 1];
  // No loss rows here means none in any later pass (theirs are a subset): nothing flows back.
  if (ps.live.empty()) {
    dg.clear();
    return Status::Ok();
  }
  const bool own = pass > 1;
  // The layer's gradients (the draft Model's layout), then fc's from d u.
  FlatTensors model_grads(ParamLayout::for_model(config_));
  std::vector<float> du;
  std::vector<ForwardTape*> earlier;
  for (int64_t q = 0; q + 1 < pass; ++q) earlier.push_back(passes[q].tape.get());
  BackwardIo io;
  io.d_input = &du;
  io.d_hidden = dg;
  io.earlier_passes = earlier;
  MILES_RETURN_IF_ERROR(model_->backward(*ps.tape, ps.d_logits, model_grads, pool, io));
  std::vector<float> dfc(static_cast<size_t>(d * 2 * d));
  kernels::gemm_weight_grad(du.data(), d, ps.x.data(), 2 * d, n, d, 2 * d, dfc.data(), pool);
  auto add = [](std::span<float> into, std::span<const float> g) {
    for (size_t i = 0; i < into.size(); ++i) into[i] = into[i] + g[i];
  };
  add(grads.get(kFc), dfc);
  for (const ParamSpec& s : grads.layout().specs()) {
    if (s.name == kFc || s.name == kFeatFc) continue;
    add(grads.get(s.name),
        std::as_const(model_grads).get(kLayerPrefix + s.name.substr(kDraftPrefix.size())));
  }
  const bool feature_grad = own || layers_.size() > 1;
  if (!feature_grad) return Status::Ok();
  // d of x's feature half: d u · fc[:, hidden:].
  kernels::PackedMatrix fc_t;
  fc_t.assign_transposed(params_.get(kFc).data() + d, d, d, 2 * d, pool);
  std::vector<float> dfeat(static_cast<size_t>(n * d));
  kernels::gemm(du.data(), n, d, fc_t, dfeat.data(), d, pool);
  if (!own) {  // P's: d P = d featureᵀ · z
    const int64_t k = layers_.size();
    std::vector<float> dp(static_cast<size_t>(d * k * d));
    kernels::gemm_weight_grad(dfeat.data(), d, ps.z.data(), k * d, n, d, k * d, dp.data(), pool);
    add(grads.get(kFeatFc), dp);
    return Status::Ok();
  }
  // The previous pass's d g: row j's feature is the final norm of g_{j−1}.
  std::vector<float> dnormed(static_cast<size_t>(n * d));
  kernels::rmsnorm_backward(ps.feat.data(), dfeat.data(), n, d, own_norm_.data(),
                            static_cast<float>(policy_.rms_norm_eps), dnormed.data(), nullptr,
                            pool);
  dg.assign(static_cast<size_t>(n * d), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    if (pr.at_pos[r] > 0) std::copy_n(dnormed.data() + r * d, d, dg.data() + (r - 1) * d);
  return Status::Ok();
}

}  // namespace miles
