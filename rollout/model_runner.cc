// make_model_runner: the shared Model as the engine's ModelRunner.
#include "miles/rollout/engine.h"

namespace miles {

Result<std::unique_ptr<ModelRunner>> ModelRunner::with_weights(const TensorMap&) const {
  return Status::Error("this model runner cannot load new weights");
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::without_weights() const {
  return Status::Error("this backend cannot release its weights");
}

namespace {

// A SharedModelRunner over new full weights of `config`.
Result<std::unique_ptr<ModelRunner>> shared_runner_from(const ModelConfig& config,
                                                        const TensorMap& weights,
                                                        ThreadPool* pool) {
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Model::from_weights(config, weights));
  return make_model_runner(std::shared_ptr<const Model>(std::move(m)), pool);
}

// A SharedModelRunner whose Model was released: the config and threads, no weights.
class ReleasedModelRunner final : public ModelRunner {
 public:
  ReleasedModelRunner(const ModelConfig& config, ThreadPool* pool) : config_(config), pool_(pool) {}
  const ModelConfig& config() const override { return config_; }
  Result<ForwardOutput> forward(std::span<const int32_t>, std::span<const SeqSpan>, KvStore&,
                                const ForwardOptions&) override {
    return Status::Error("the weights are released; a weight update brings them back");
  }
  ThreadPool* thread_pool() const override { return pool_; }
  Result<std::unique_ptr<ModelRunner>> with_weights(const TensorMap& weights) const override {
    return shared_runner_from(config_, weights, pool_);
  }

 private:
  ModelConfig config_;
  ThreadPool* pool_;
};

class SharedModelRunner final : public ModelRunner {
 public:
  SharedModelRunner(std::shared_ptr<const Model> model, ThreadPool* pool)
      : model_(std::move(model)), pool_(pool) {}
  const ModelConfig& config() const override { return model_->config(); }
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore& kv, const ForwardOptions& options) override {
    return model_->forward(tokens, seqs, kv, options, pool_);
  }
  ThreadPool* thread_pool() const override { return pool_; }
  Result<std::unique_ptr<ModelRunner>> with_weights(const TensorMap& weights) const override {
    return shared_runner_from(model_->config(), weights, pool_);
  }
  Result<std::unique_ptr<ModelRunner>> without_weights() const override {
    return std::unique_ptr<ModelRunner>(new ReleasedModelRunner(model_->config(), pool_));
  }

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool* pool_;
};
}  // namespace

std::unique_ptr<ModelRunner> make_model_runner(std::shared_ptr<const Model> model, ThreadPool* pool) {
  return std::make_unique<SharedModelRunner>(std::move(model), pool);
}

}  // namespace miles
