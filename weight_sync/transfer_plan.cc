// make_transfer_plan: stage → (non-expert, expert) → fused groups packed greedily into buckets.
#include "miles/weight_sync/transfer_plan.h"

#include <algorithm>

namespace miles {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The pipeline stage owning a tensor (the trainer's split: stage_layers in trainer.h; repeated here
// so that weight_sync depends on the core only): layers by index, the embedding on stage 0, the
// final norm and LM head on the last stage.
int stage_of(const std::string& name, int64_t num_layers, int stages) {
  if (name.rfind("model.layers.", 0) == 0) {
    const int64_t layer = std::stoll(name.substr(13));
    const int64_t base = num_layers / stages, extra = num_layers % stages;
    for (int s = 0; s < stages; ++s) {
      const int64_t begin = s * base + std::min<int64_t>(s, extra);
      if (layer < begin + base + (s < extra ? 1 : 0)) return s;
    }
  }
  return name == "model.embed_tokens.weight" ? 0 : stages - 1;
}

struct Group {
  std::vector<const ParamSpec*> specs;
  int64_t bytes = 0;
};

}  // namespace

Status TransferPlanOptions::validate() const {
  if (bucket_bytes <= 0) return Status::Error("weight_sync.bucket_bytes must be > 0");
  return Status::Ok();
}

std::string fused_group(const std::string& name) {
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias",
                        "k_proj.bias", "v_proj.bias"})
    if (ends_with(name, p)) return name.substr(0, name.size() - std::string(p).size()) + "qkv";
  for (const char* p : {"gate_proj.weight", "up_proj.weight"})
    if (ends_with(name, p)) return name.substr(0, name.size() - std::string(p).size()) + "gate_up";
  return "";
}

std::vector<std::string> TransferPlan::tensor_names() const {
  std::vector<std::string> out;
  for (const Bucket& b : buckets)
    for (const PlannedTensor& t : b.tensors) out.push_back(t.name);
  return out;
}

TransferPlan stage_plan(const TransferPlan& plan, int stage) {
  TransferPlan out;
  for (const Bucket& b : plan.buckets) {
    if (b.stage != stage) continue;
    out.buckets.push_back(b);
    out.buckets.back().sender = 0;
    out.total_bytes += b.bytes;
  }
  return out;
}

int plan_stages(const TransferPlan& plan) {
  int n = 1;
  for (const Bucket& b : plan.buckets) n = std::max(n, b.stage + 1);
  return n;
}

Result<TransferPlan> make_transfer_plan(const ModelConfig& config, const ParamLayout& params,
                                        const ParallelLayout& trainer,
                                        const TransferPlanOptions& options) {
  MILES_RETURN_IF_ERROR(options.validate());
  if (trainer.pp() > config.num_layers)
    return Status::Error("pp=" + std::to_string(trainer.pp()) + " exceeds the model's " +
                         std::to_string(config.num_layers) + " layers");
  TransferPlan plan;
  for (int stage = 0; stage < trainer.pp(); ++stage) {
    for (bool expert : {false, true}) {
      // Fused groups in layout order (a group's members are adjacent in the canonical layout).
      std::vector<Group> groups;
      std::string last_key;
      for (const ParamSpec& s : params.specs()) {
        if (stage_of(s.name, config.num_layers, trainer.pp()) != stage) continue;
        if ((s.name.find(".mlp.experts.") != std::string::npos) != expert) continue;
        const std::string key = fused_group(s.name);
        if (key.empty() || key != last_key) groups.push_back({});
        groups.back().specs.push_back(&s);
        groups.back().bytes += s.numel * static_cast<int64_t>(sizeof(float));
        last_key = key;
      }
      Bucket cur;
      auto flush = [&] {
        if (cur.tensors.empty()) return;
        plan.total_bytes += cur.bytes;
        plan.buckets.push_back(std::move(cur));
        cur = Bucket{};
      };
      for (const Group& g : groups) {
        if (!cur.tensors.empty() && cur.bytes + g.bytes > options.bucket_bytes) flush();
        cur.stage = stage;
        cur.sender = trainer.stage_leader(stage);
        cur.expert = expert;
        for (const ParamSpec* s : g.specs) {
          const int64_t bytes = s->numel * static_cast<int64_t>(sizeof(float));
          cur.tensors.push_back({s->name, s->shape, cur.bytes, bytes});
          cur.bytes += bytes;
        }
      }
      flush();
    }
  }
  return plan;
}

}  // namespace miles
