// make_device_model_runner: a DeviceModel as the engine's ModelRunner. The engine schedules and
// samples on the host; each forward hands the device its batch and block tables, and the device
// keeps the KV blocks (the same block ids as the engine's pool, which holds no KV itself).
#include "miles/device_model.h"
#include "miles/rollout/engine.h"
#include "rollout/paged_kv_cache.h"

namespace miles {

namespace {

class DeviceModelRunner final : public ModelRunner {
 public:
  DeviceModelRunner(std::unique_ptr<DeviceModel> model, ThreadPool* pool)
      : model_(std::move(model)), pool_(pool) {}
  const ModelConfig& config() const override { return model_->config(); }
  ThreadPool* thread_pool() const override { return pool_; }
  int64_t kv_dim() const override { return 0; }
  void copied_kv_prefix(int32_t src, int32_t dst, int64_t positions) override {
    // A failed copy (the device gone) surfaces as the next forward's error.
    if (Status s = model_->copy_kv_block(src, dst, positions); !s.ok() && pending_error_.ok())
      pending_error_ = s;
  }
  Result<std::unique_ptr<ModelRunner>> with_weights(const TensorMap& weights) const override {
    MILES_ASSIGN_OR_RETURN(std::unique_ptr<DeviceModel> next, model_->with_weights(weights));
    return std::unique_ptr<ModelRunner>(
        std::make_unique<DeviceModelRunner>(std::move(next), pool_));
  }
  Result<ForwardOutput> forward(std::span<const int32_t> tokens, std::span<const SeqSpan> seqs,
                                KvStore& kv, const ForwardOptions& options) override {
    if (!pending_error_.ok()) return pending_error_;
    if (!options.forced_experts.empty() || options.tape || options.tp || options.layer_begin != 0 ||
        options.layer_end >= 0)
      return Status::Error(std::string("a ") + device_name(model_->device()) +
                           " engine runs whole-model inference forwards only");
    auto* paged = dynamic_cast<rollout::PagedKvCache*>(&kv);
    MILES_CHECK(paged != nullptr, "a device engine runs over the engine's paged KV cache");
    DeviceBatch batch;
    batch.tokens = tokens;
    batch.seqs = seqs;
    batch.all_logits = options.all_logits;
    batch.last_rows = options.last_rows;
    batch.return_experts = options.return_experts;
    batch.return_hidden = options.return_hidden;
    batch.tap_layers = options.tap_layers;
    for (const SeqSpan& q : seqs) {
      MILES_RETURN_IF_ERROR(kv.reserve(q.kv_slot, q.start_pos + q.n_tokens));
      batch.tables.emplace_back(paged->table(q.kv_slot));
    }
    return model_->forward(batch);
  }

 private:
  std::unique_ptr<DeviceModel> model_;
  ThreadPool* pool_;
  Status pending_error_ = Status::Ok();
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> make_device_model_runner(Device device,
                                                              const ModelConfig& config,
                                                              const TensorMap& weights,
                                                              const EngineOptions& kv_geometry,
                                                              ThreadPool* pool) {
  DeviceKvGeometry g;
  g.num_blocks = kv_geometry.num_blocks;
  g.block_tokens = kv_geometry.block_tokens;
  MILES_ASSIGN_OR_RETURN(std::unique_ptr<DeviceModel> m,
                         make_device_model(device, config, weights, g, pool));
  return std::unique_ptr<ModelRunner>(std::make_unique<DeviceModelRunner>(std::move(m), pool));
}

}  // namespace miles
