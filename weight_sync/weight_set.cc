// ReceivedWeights, checksums, verification and the engine-side swap (weight_sync.h).
#include "miles/rollout/engine.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/xxh3.h"

namespace miles {

std::string xxh3_128_hex(const void* data, size_t size) {
  return weight_sync_detail::xxh3_hex(data, size);
}

TensorMap ReceivedWeights::view() const {
  TensorMap m;
  const std::string source = "weight version " + std::to_string(version);
  for (const auto& [name, values] : tensors)
    m.insert(name, Tensor::view(DType::kF32, shapes.at(name), values.data(), nullptr), source);
  for (const auto& [name, values] : lent)
    m.insert(name, Tensor::view(DType::kF32, shapes.at(name), values.data(), lent_owner), source);
  return m;
}

std::optional<std::span<const float>> ReceivedWeights::values(const std::string& name) const {
  if (auto it = tensors.find(name); it != tensors.end()) return std::span<const float>(it->second);
  if (auto it = lent.find(name); it != lent.end()) return it->second;
  return std::nullopt;
}

Status verify_received_weights(const ReceivedWeights& set, const TransferPlan& plan) {
  const std::string at = "weight version " + std::to_string(set.version) + ": ";
  for (const Bucket& b : plan.buckets)
    for (const PlannedTensor& t : b.tensors) {
      const std::optional<std::span<const float>> values = set.values(t.name);
      if (!values) return Status::Error(at + "tensor " + t.name + " never arrived");
      if (static_cast<int64_t>(values->size_bytes()) != t.bytes)
        return Status::Error(at + "tensor " + t.name + " has the wrong size");
      auto sum = set.checksums.find(t.name);
      if (sum == set.checksums.end()) return Status::Error(at + "no checksum for " + t.name);
      if (set.verified) continue;
      const std::string got = xxh3_128_hex(values->data(), t.bytes);
      if (got != sum->second)
        return Status::Error(at + "checksum mismatch for " + t.name + " (got " + got +
                             ", the sender's " + sum->second + ")");
    }
  if (set.size() != plan.tensor_names().size())
    return Status::Error(at + "holds tensors outside the plan");
  return Status::Ok();
}

Status check_weights(const std::map<std::string, std::string>& engine_checksums,
                     const TransferPlan& plan, const TensorSource& trainer) {
  std::vector<std::string> bad;
  size_t total = 0;
  for (const Bucket& b : plan.buckets)
    for (const PlannedTensor& t : b.tensors) {
      ++total;
      std::span<const float> v = trainer(t.name);
      auto it = engine_checksums.find(t.name);
      if (it == engine_checksums.end() || it->second != xxh3_128_hex(v.data(), v.size_bytes()))
        bad.push_back(t.name);
    }
  if (bad.empty()) return Status::Ok();
  std::string names;
  for (size_t i = 0; i < bad.size() && i < 5; ++i) names += (i ? ", " : "") + bad[i];
  return Status::Error("check_weights: " + std::to_string(bad.size()) + " of " +
                       std::to_string(total) + " tensors differ from the trainer's (" + names +
                       (bad.size() > 5 ? ", …" : "") + ")");
}

namespace {
// begin → update → version → end; on any error the engine keeps its weights and version.
Status swap_in(Engine& engine, int64_t version, const std::function<Status()>& update) {
  MILES_RETURN_IF_ERROR(engine.begin_weight_update());
  Status s = update();
  if (s.ok()) engine.update_weight_version(version);
  Status end = engine.end_weight_update();
  MILES_RETURN_IF_ERROR(s);
  return end;
}
}  // namespace

Status apply_to_engine(Engine& engine, const ModelConfig& config, const ReceivedWeights& set,
                       const TransferPlan& plan, ThreadPool* pool) {
  MILES_RETURN_IF_ERROR(verify_received_weights(set, plan));
  const TensorMap view = set.view();
  // The engine's runner builds (and reshards) the model.
  return swap_in(engine, set.version, [&] { return engine.update_weights(view); });
}

Status apply_runner_to_engine(Engine& engine, std::unique_ptr<ModelRunner> runner,
                              int64_t version) {
  return swap_in(engine, version, [&] { return engine.update_weights(std::move(runner)); });
}

}  // namespace miles
