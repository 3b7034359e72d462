// A trainer's place in a parallel layout: its pipeline stage (the layers and tensors it owns), its
// tensor-parallel shard, and gathering the whole state back from stages and shards (trainer.h).
#include <algorithm>
#include <tuple>

#include "miles/comm.h"
#include "miles/tensor_parallel.h"
#include "miles/trainer/trainer.h"
#include "trainer/draft_trainer.h"

namespace miles {

std::pair<int64_t, int64_t> stage_layers(int64_t num_layers, int stage, int num_stages) {
  const int64_t base = num_layers / num_stages, extra = num_layers % num_stages;
  const int64_t begin = stage * base + std::min<int64_t>(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

Status Trainer::set_pipeline_stage(int stage, int num_stages) {
  const int64_t layers = config_.num_layers;
  if (num_stages < 1 || stage < 0 || stage >= num_stages)
    return Status::Error("pipeline stage " + std::to_string(stage) + " of " +
                         std::to_string(num_stages) + " is out of range");
  if (num_stages > 1 && tc_.device != Device::kCpu)
    return Status::Error(std::string("a ") + device_name(tc_.device) +
                         " trainer runs one pipeline stage for now (pp=1)");
  if (num_stages > layers)
    return Status::Error("pp=" + std::to_string(num_stages) + " exceeds the model's " +
                         std::to_string(layers) + " layers");
  stage_.stage = stage;
  stage_.num_stages = num_stages;
  std::tie(stage_.layer_begin, stage_.layer_end) = stage_layers(layers, stage, num_stages);
  const std::vector<ParamSpec>& specs = layout_->specs();
  owned_.assign(specs.size(), false);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& n = specs[i].name;
    if (n.rfind("model.layers.", 0) == 0) {
      const int64_t layer = std::stoll(n.substr(13));
      owned_[i] = layer >= stage_.layer_begin && layer < stage_.layer_end;
    } else if (n == "model.embed_tokens.weight") {
      owned_[i] = stage_.first() || (stage_.last() && config_.tie_word_embeddings);
    } else {  // model.norm.weight, lm_head.weight
      owned_[i] = stage_.last();
    }
  }
  return Status::Ok();
}

Status Trainer::shard_for_tensor_parallel(Communicator& tp) {
  if (tp_.comm) return Status::Error("the trainer is already sharded");
  if (tp.size() == 1) return Status::Ok();
  if (tc_.device != Device::kCpu)
    return Status::Error(std::string("a ") + device_name(tc_.device) +
                         " trainer runs without tensor parallelism for now (tp=1)");
  MILES_ASSIGN_OR_RETURN(ModelConfig local, tensor_parallel::local_config(config_, tp.size()));
  const TensorMap full_view = params_.as_tensor_map();
  auto layout = ParamLayout::for_model(local, &full_view);
  FlatTensors p(layout), m(layout), v(layout);
  tensor_parallel::slice(params_, p, tp.rank(), tp.size());
  tensor_parallel::slice(opt_->exp_avg(), m, tp.rank(), tp.size());
  tensor_parallel::slice(opt_->exp_avg_sq(), v, tp.rank(), tp.size());
  const int64_t steps = opt_->steps();
  local_config_ = local;
  layout_ = layout;
  params_ = std::move(p);
  opt_ = std::make_unique<AdamW>(layout_, tc_.optimizer);
  opt_->exp_avg() = std::move(m);
  opt_->exp_avg_sq() = std::move(v);
  opt_->set_steps(steps);
  tp_ = TensorParallel{&tp, tp.rank() * local.vocab_size, config_.vocab_size};
  MILES_RETURN_IF_ERROR(set_pipeline_stage(stage_.stage, stage_.num_stages));
  return reload_model();
}

Result<std::unique_ptr<Trainer>> Trainer::gather_tensor_parallel(Communicator& tp) const {
  std::unique_ptr<Trainer> full(new Trainer());
  full->config_ = config_;
  full->local_config_ = config_;
  full->tc_ = tc_;
  full->tc_.device = Device::kCpu;  // a host-side copy for checkpoints and exports
  full->pool_ = pool_;
  full->layout_ = full_layout_;
  full->full_layout_ = full_layout_;
  full->params_ = FlatTensors(full_layout_);
  full->opt_ = std::make_unique<AdamW>(full_layout_, tc_.optimizer);
  full->opt_->set_steps(opt_->steps());
  const int n = tp.size();
  const FlatTensors* mine[3] = {&params_, &opt_->exp_avg(), &opt_->exp_avg_sq()};
  FlatTensors* out[3] = {&full->params_, &full->opt_->exp_avg(), &full->opt_->exp_avg_sq()};
  for (const ParamSpec& s : full_layout_->specs()) {
    for (int k = 0; k < 3; ++k) {
      std::span<const float> local = mine[k]->get(s.name);
      std::vector<float> all(local.size() * n);
      MILES_RETURN_IF_ERROR(tp.allgather(local.data(), local.size_bytes(), all.data()));
      tensor_parallel::assemble(s.name, s.shape, all, n, out[k]->get(s.name));
    }
  }
  if (draft_) {  // every rank of the group holds the whole head
    MILES_ASSIGN_OR_RETURN(
        full->draft_, trainer_detail::DraftTrainer::create(config_, full->params_.as_tensor_map(),
                                                           tc_.draft, tc_.optimizer));
    MILES_RETURN_IF_ERROR(full->draft_->restore(draft_->state(), full->params_.as_tensor_map()));
  }
  MILES_RETURN_IF_ERROR(full->set_pipeline_stage(stage_.stage, stage_.num_stages));
  MILES_RETURN_IF_ERROR(full->reload_model());
  return full;
}

Status Trainer::gather_pipeline_state(Communicator& pp) {
  if (pp.size() != stage_.num_stages)
    return Status::Error("gather_pipeline_state: the group does not match the stage count");
  if (pp.size() == 1) return Status::Ok();
  const std::vector<ParamSpec>& specs = layout_->specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    // The owner: the stage holding the layer, stage 0 for the embedding, the last for the head.
    int owner = pp.size() - 1;
    const std::string& n = specs[i].name;
    if (n == "model.embed_tokens.weight") owner = 0;
    if (n.rfind("model.layers.", 0) == 0) {
      const int64_t layer = std::stoll(n.substr(13));
      for (int s = 0; s < pp.size(); ++s) {
        const auto [b, e] = stage_layers(config_.num_layers, s, pp.size());
        if (layer >= b && layer < e) owner = s;
      }
    }
    for (FlatTensors* f : {&params_, &opt_->exp_avg(), &opt_->exp_avg_sq()}) {
      std::span<float> v = f->all().subspan(specs[i].offset, specs[i].numel);
      MILES_RETURN_IF_ERROR(pp.broadcast(v.data(), v.size_bytes(), owner));
    }
  }
  if (draft_) MILES_RETURN_IF_ERROR(draft_->share_state(pp, pp.size() - 1));  // it ran AdamW
  return reload_model();
}

}  // namespace miles
