// Shared by the gradient and optimizer tests: a tiny checkpoint with its torch goldens
// (scripts/make_grad_goldens.py) and the loss (Σ c·(−log p) − β Σ H) / N over four packed
// sequences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "miles/checkpoint.h"
#include "miles/flat_params.h"
#include "miles/hf_names.h"
#include "miles/logprob.h"
#include "miles/model.h"
#include "test_paths.h"

namespace miles::test {

struct Case {
  ModelConfig config;
  TensorMap weights;
  std::unique_ptr<Model> model;
  TensorMap golden;
  std::vector<int32_t> tokens;  // seq1..seq4 packed
  std::vector<SeqSpan> seqs;
  std::vector<float> coef;       // per token; 0 on each sequence's last token
  std::vector<int32_t> targets;  // next token; 0 on each sequence's last token
  float beta = 0.0f;
  int64_t n_targets = 0;
};

// The golden under the model's names: torch's gradients of fused checkpoint tensors (Phi-3's
// qkv_proj, gate_up_proj: "grad.<name>") split into their parts' rows (hf_names.h).
inline TensorMap golden_in_model_names(const ModelConfig& config, const TensorMap& golden) {
  TensorMap grads, out;
  for (const std::string& n : golden.names()) {
    if (n.rfind("grad.", 0) == 0) {
      grads.insert(n.substr(5), *golden.find(n), golden.source(n));
    } else {
      out.insert(n, *golden.find(n), golden.source(n));
    }
  }
  auto split = from_hf_names(config, grads);
  EXPECT_TRUE(split.ok()) << split.message();
  for (const std::string& n : split->names())
    out.insert("grad." + n, *split->find(n), split->source(n));
  return out;
}

inline Case load_case(const std::string& name) {
  Case c;
  const std::string dir = test::data_dir() + "/models/" + name;
  auto cfg = load_model_config(dir + "/config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.message();
  auto w = read_hf_weights(dir);
  EXPECT_TRUE(w.ok()) << w.message();
  c.config = *cfg;
  auto named = from_hf_names(c.config, *w);  // Phi-3's fused projections
  EXPECT_TRUE(named.ok()) << named.message();
  c.weights = std::move(*named);
  auto m = Model::from_weights(c.config, c.weights);
  EXPECT_TRUE(m.ok()) << m.message();
  c.model = std::move(*m);
  auto g = read_safetensors(test::data_dir() + "/grad_goldens/" + name + ".safetensors");
  EXPECT_TRUE(g.ok()) << g.message();
  c.golden = golden_in_model_names(c.config, *g);
  c.beta = c.golden.find("beta")->data<float>()[0];
  for (int i = 1; i <= 4; ++i) {
    const std::string p = "seq" + std::to_string(i) + ".";
    const Tensor* ids = c.golden.find(p + "ids");
    const Tensor* coef = c.golden.find(p + "coef");
    const int64_t t = ids->numel();
    c.seqs.push_back({i, 0, t});
    for (int64_t j = 0; j < t; ++j) {
      c.tokens.push_back(ids->data<int32_t>()[j]);
      c.targets.push_back(j + 1 < t ? ids->data<int32_t>()[j + 1] : 0);
      c.coef.push_back(j + 1 < t ? coef->data<float>()[j] : 0.0f);
    }
    c.n_targets += t - 1;
  }
  return c;
}

struct GradRun {
  double loss = 0;
  std::vector<float> logp, entropy, logits;
  FlatTensors grads;
};

// Loss and gradients of `model` (default: the case's own) on the case's batch.
inline GradRun run_grad(const Case& c, ThreadPool* pool, const Model* model = nullptr,
                        const TensorMap* weights = nullptr) {
  if (!model) model = c.model.get();
  if (!weights) weights = &c.weights;
  GradRun r;
  auto kv = model->make_kv_cache();
  ForwardTape tape;
  ForwardOptions opt;
  opt.tape = &tape;
  auto out = model->forward(c.tokens, c.seqs, *kv, opt, pool);
  EXPECT_TRUE(out.ok()) << out.message();
  const int64_t t = c.tokens.size(), v = c.config.vocab_size;
  r.logits = out->logits;
  r.logp.resize(t);
  r.entropy.resize(t);
  token_logprobs(out->logits.data(), t, v, c.targets.data(), r.logp.data(), r.entropy.data());
  std::vector<float> dlogp(t), dent(t);
  const float n = static_cast<float>(c.n_targets);
  int64_t i = 0;
  for (const SeqSpan& s : c.seqs) {
    for (int64_t j = 0; j < s.n_tokens; ++j, ++i) {
      if (j + 1 == s.n_tokens) continue;
      r.loss += c.coef[i] * -static_cast<double>(r.logp[i]) - c.beta * r.entropy[i];
      dlogp[i] = -c.coef[i] / n;
      dent[i] = -c.beta / n;
    }
  }
  r.loss /= n;
  std::vector<float> dlogits(static_cast<size_t>(t * v));
  token_logprobs_backward(out->logits.data(), t, v, c.targets.data(), dlogp.data(), dent.data(),
                          dlogits.data());
  r.grads = FlatTensors(ParamLayout::for_model(c.config, weights));
  Status st = model->backward(tape, dlogits, r.grads, pool);
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

}  // namespace miles::test
