// make_model_runner: the shared Model as the engine's ModelRunner.
#include "miles/engine.h"

namespace miles {

namespace {
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

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool* pool_;
};
}  // namespace

std::unique_ptr<ModelRunner> make_model_runner(std::shared_ptr<const Model> model, ThreadPool* pool) {
  return std::make_unique<SharedModelRunner>(std::move(model), pool);
}

}  // namespace miles
