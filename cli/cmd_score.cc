// `miles score`: teacher-forced logprobs of every token after the first, and (MoE) the experts chosen
// per token and layer, as JSON — the lowest-level view of what rollout and trainer must agree on.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "miles/kernels.h"
#include "miles/model.h"
#include "miles/thread_pool.h"

namespace miles::cli {

namespace {

struct ScoreOptions {
  std::string model, input_ids;
  int threads = 0;
};

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (...) {
      used = 0;
    }
    if (used != word.size() || v < INT32_MIN || v > INT32_MAX)
      return Status::Error("--input-ids: '" + word + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return Status::Error("--input-ids: no token ids given");
  return ids;
}

int run_score(const ScoreOptions& o) {
  auto ids = parse_ids(o.input_ids);
  if (!ids.ok()) return fail("score", ids.message());
  auto model = Model::load(o.model);
  if (!model.ok()) return fail("score", model.message());
  const Model& m = **model;
  ThreadPool pool(o.threads);
  auto kv = m.make_kv_cache();
  SeqSpan span{0, 0, static_cast<int64_t>(ids->size())};
  ForwardOptions fo;
  fo.return_experts = true;
  auto out = m.forward(*ids, {&span, 1}, *kv, fo, &pool);
  if (!out.ok()) return fail("score", out.message());

  const int64_t v = out->vocab, t = ids->size();
  nlohmann::json j;
  j["input_ids"] = *ids;
  std::vector<float> lp(static_cast<size_t>(v));
  nlohmann::json logprobs = nlohmann::json::array();
  for (int64_t i = 0; i + 1 < t; ++i) {
    kernels::log_softmax_row(out->logits.data() + i * v, v, lp.data());
    logprobs.push_back(lp[(*ids)[i + 1]]);
  }
  j["logprobs"] = logprobs;
  if (!out->experts.empty()) {
    const int64_t layers = m.config().num_moe_layers(), k = m.config().moe.top_k;
    nlohmann::json experts = nlohmann::json::array();
    for (int64_t i = 0; i < t; ++i) {
      nlohmann::json per_layer = nlohmann::json::array();
      for (int64_t l = 0; l < layers; ++l) {
        const int32_t* e = out->experts.data() + (i * layers + l) * k;
        per_layer.push_back(std::vector<int32_t>(e, e + k));
      }
      experts.push_back(per_layer);
    }
    j["experts"] = experts;  // [tokens, moe layers, top_k]
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_score(CLI::App& app) {
  auto o = std::make_shared<ScoreOptions>();
  CLI::App* sub = app.add_subcommand("score", "Teacher-forced logprobs (and MoE experts) as JSON");
  sub->add_option("--model", o->model, "HF model directory or llama2.c checkpoint")->required();
  sub->add_option("--input-ids", o->input_ids, "token ids, space-separated")->required();
  sub->add_option("--threads", o->threads, "0 = all cores")->capture_default_str();
  sub->callback([o] {
    if (int rc = run_score(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
