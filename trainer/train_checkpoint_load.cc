// load_checkpoint: verify everything, then restore parameters, AdamW moments and step count (and
// the draft head's state when the trainer has one).
//
// Why: a resumed run must be bit-identical to an uninterrupted one, so a checkpoint that is
// truncated, corrupted, or from another model or format must be refused with an error naming the
// file and the tensor or key, and the trainer is only changed once every check has passed.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <utility>

#include "miles/hf_names.h"
#include "miles/json_text.h"
#include "miles/trainer/train_checkpoint.h"
#include "nlohmann/json.hpp"
#include "trainer/train_checkpoint_io.h"

namespace miles {
namespace {

using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) { return json(shape).dump(); }

// Typed reads from trainer_state.json; errors name the file and the key path.
struct StateReader {
  const std::string& file;
  Status error(const std::string& key, const std::string& what) const {
    return Status::Error(file + ": key '" + key + "' " + what);
  }
  Result<const json*> at(const json& obj, const char* key, const std::string& path) const {
    auto it = obj.find(key);
    if (!obj.is_object() || it == obj.end()) return error(path, "is missing");
    return &*it;
  }
  template <typename T>
  Status get(const json& obj, const char* key, const std::string& path, T* out) const {
    MILES_ASSIGN_OR_RETURN(const json* v, at(obj, key, path));
    if constexpr (std::is_same_v<T, uint64_t>) {
      if (!v->is_number_unsigned()) return error(path, "must be a non-negative integer");
    } else if constexpr (std::is_integral_v<T>) {
      if (!v->is_number_integer()) return error(path, "must be an integer");
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v->is_string()) return error(path, "must be a string");
    }
    *out = v->get<T>();
    return Status::Ok();
  }
};

// Expected names, shapes and hashes, checked against the trainer's layout.
struct Recorded {
  std::vector<std::string> sha, exp_avg_sha, exp_avg_sq_sha;  // in layout order
};

Result<Recorded> check_layout(const json& tensors, const ParamLayout& layout,
                              const StateReader& r) {
  const auto& specs = layout.specs();
  if (!tensors.is_array()) return r.error("tensors", "must be a list");
  if (tensors.size() != specs.size())
    return r.error("tensors", "lists " + std::to_string(tensors.size()) +
                                  " tensors, the trainer's model has " +
                                  std::to_string(specs.size()));
  Recorded rec;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string at = "tensors[" + std::to_string(i) + "]";
    std::string name;
    std::vector<int64_t> shape;
    MILES_RETURN_IF_ERROR(r.get(tensors[i], "name", at + ".name", &name));
    MILES_ASSIGN_OR_RETURN(const json* sj, r.at(tensors[i], "shape", at + ".shape"));
    try {
      shape = sj->get<std::vector<int64_t>>();
    } catch (const json::exception&) {
      return r.error(at + ".shape", "must be a list of integers");
    }
    if (name != specs[i].name || shape != specs[i].shape)
      return r.error(at, "is '" + name + "' " + shape_str(shape) + ", the trainer's model has '" +
                             specs[i].name + "' " + shape_str(specs[i].shape) + " there");
    std::string a, b, c;
    MILES_RETURN_IF_ERROR(r.get(tensors[i], "sha256", at + ".sha256", &a));
    MILES_RETURN_IF_ERROR(r.get(tensors[i], "exp_avg_sha256", at + ".exp_avg_sha256", &b));
    MILES_RETURN_IF_ERROR(r.get(tensors[i], "exp_avg_sq_sha256", at + ".exp_avg_sq_sha256", &c));
    rec.sha.push_back(a);
    rec.exp_avg_sha.push_back(b);
    rec.exp_avg_sq_sha.push_back(c);
  }
  return rec;
}

// Copies `file`'s tensors `prefix + name` into `into` (trainer layout), each checked for
// presence, dtype, shape and sha256.
Status copy_verified(const TensorMap& file, const std::string& path, const std::string& prefix,
                     const std::vector<std::string>& sha, FlatTensors& into) {
  const auto& specs = into.layout().specs();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string name = prefix + specs[i].name;
    const Tensor* t = file.find(name);
    if (!t) return Status::Error(path + ": tensor '" + name + "' is missing");
    if (t->dtype() != DType::kF32 || t->shape() != specs[i].shape)
      return Status::Error(path + ": tensor '" + name + "' is " +
                           std::string(dtype_name(t->dtype())) + " " + t->shape_string() +
                           ", expected F32 " + shape_str(specs[i].shape));
    const std::span<const float> values(t->data<float>(), static_cast<size_t>(t->numel()));
    const std::string got = tensor_sha256(values);
    if (got != sha[i])
      return Status::Error(path + ": tensor '" + name + "' fails its sha256 check (data " + got +
                           ", " + ckpt::kStateFile + " records " + sha[i] + ")");
    std::copy(values.begin(), values.end(), into.get(specs[i].name).begin());
  }
  return Status::Ok();
}

// The file holds exactly `prefixes` × the layout's names.
Status check_no_extra(const TensorMap& file, const std::string& path,
                      std::initializer_list<const char*> prefixes, const ParamLayout& layout,
                      const std::string& also = "") {
  for (const std::string& name : file.names()) {
    bool known = !also.empty() && name == also;
    for (const std::string p : prefixes)
      known = known || (name.rfind(p, 0) == 0 && layout.find(name.substr(p.size())));
    if (!known) return Status::Error(path + ": unexpected tensor '" + name + "'");
  }
  return Status::Ok();
}

// config.json must describe the trainer's model: compared key by key in our own spelling.
Status check_config(const std::string& path, const ModelConfig& trainer_config) {
  MILES_ASSIGN_OR_RETURN(ModelConfig saved, load_model_config(path));
  const json a = json::parse(model_config_to_hf_json(saved));
  const json b = json::parse(model_config_to_hf_json(trainer_config));
  for (auto it = b.begin(); it != b.end(); ++it) {
    const json va = a.contains(it.key()) ? a[it.key()] : json();
    if (va != it.value())
      return Status::Error(path + ": key '" + it.key() + "' is " + va.dump() +
                           ", the trainer's model has " + it.value().dump());
  }
  return Status::Ok();
}

Result<TrainState> read_train_state(const json& j, const StateReader& r) {
  MILES_ASSIGN_OR_RETURN(const json* ts, r.at(j, "train_state", "train_state"));
  TrainState s;
  MILES_RETURN_IF_ERROR(r.get(*ts, "step", "train_state.step", &s.step));
  MILES_RETURN_IF_ERROR(r.get(*ts, "data_position", "train_state.data_position", &s.data_position));
  MILES_ASSIGN_OR_RETURN(const json* rng, r.at(*ts, "rng", "train_state.rng"));
  MILES_RETURN_IF_ERROR(r.get(*rng, "seed", "train_state.rng.seed", &s.rng_seed));
  MILES_RETURN_IF_ERROR(r.get(*rng, "counter", "train_state.rng.counter", &s.rng_counter));
  MILES_ASSIGN_OR_RETURN(const json* extra, r.at(*ts, "extra", "train_state.extra"));
  if (!extra->is_null()) s.extra_json = extra->dump();
  return s;
}

// The draft head's saved state, when both the checkpoint and the trainer have a head: the file's
// sha256 as trainer_state.json records it, every tensor of the trainer's head layout (nothing
// else), the id counts of the policy's vocabulary. Without a head in the trainer the saved one is
// not read (the caller sees draft_state() fail); without one in the checkpoint the head stays new.
Result<std::optional<DraftTrainState>> read_draft(const std::string& dir, const json& j,
                                                  const StateReader& r, const Trainer& trainer) {
  if (!j.contains("draft") || !trainer.draft()) return std::optional<DraftTrainState>();
  const json& d = j["draft"];
  std::string sha;
  int64_t steps = 0;
  MILES_RETURN_IF_ERROR(r.get(d, "sha256", "draft.sha256", &sha));
  MILES_RETURN_IF_ERROR(r.get(d, "steps", "draft.steps", &steps));
  if (steps < 0) return r.error("draft.steps", "must be >= 0");
  const std::string path = dir + "/" + ckpt::kDraftFile;
  MILES_ASSIGN_OR_RETURN(const std::string bytes, ckpt::read_file(path));
  const std::string got = bytes_sha256(bytes.data(), bytes.size());
  if (got != sha)
    return Status::Error(path + ": fails its sha256 check (data " + got + ", " + ckpt::kStateFile +
                         " records " + sha + ")");
  MILES_ASSIGN_OR_RETURN(const TensorMap file, read_safetensors(path));
  MILES_ASSIGN_OR_RETURN(DraftTrainState s, trainer.draft_state());  // the layout to fill
  s.steps = steps;
  for (auto [prefix, into] : {std::pair{"", &s.params}, std::pair{ckpt::kExpAvg, &s.exp_avg},
                              std::pair{ckpt::kExpAvgSq, &s.exp_avg_sq}}) {
    for (const ParamSpec& spec : into->layout().specs()) {
      const std::string name = prefix + spec.name;
      const Tensor* t = file.find(name);
      if (!t) return Status::Error(path + ": tensor '" + name + "' is missing");
      if (t->dtype() != DType::kF32 || t->shape() != spec.shape)
        return Status::Error(path + ": tensor '" + name + "' is " +
                             std::string(dtype_name(t->dtype())) + " " + t->shape_string() +
                             ", expected F32 " + shape_str(spec.shape));
      std::copy_n(t->data<float>(), spec.numel, into->get(spec.name).begin());
    }
  }
  const Tensor* counts = file.find(ckpt::kDraftCounts);
  const int64_t vocab = trainer.model_config().vocab_size;
  if (!counts || counts->dtype() != DType::kI64 || counts->shape() != std::vector<int64_t>{vocab})
    return Status::Error(path + ": tensor '" + ckpt::kDraftCounts + "' must be I64 [" +
                         std::to_string(vocab) + "] (the policy vocabulary's id counts)");
  const auto* c = counts->data<int64_t>();
  s.counts.assign(c, c + vocab);
  MILES_RETURN_IF_ERROR(check_no_extra(file, path, {"", ckpt::kExpAvg, ckpt::kExpAvgSq},
                                       *s.params.layout_ptr(), ckpt::kDraftCounts));
  return std::optional<DraftTrainState>(std::move(s));
}

}  // namespace

Result<TrainState> load_checkpoint(const std::string& dir, Trainer& trainer) {
  const std::string state_path = dir + "/" + ckpt::kStateFile;
  auto text = ckpt::read_file(state_path);
  if (!text.ok())
    return Status::Error(text.message() + " (not a complete checkpoint: " + ckpt::kStateFile +
                         " is written last)");
  auto parsed = parse_json_text(*text);
  if (!parsed.ok()) return Status::Error(state_path + ": not valid JSON: " + parsed.message());
  const json& j = *parsed;
  const StateReader r{state_path};
  std::string format;
  int64_t version = 0, steps = 0;
  MILES_RETURN_IF_ERROR(r.get(j, "format", "format", &format));
  if (format != ckpt::kFormat)
    return r.error("format", "is '" + format + "', not " + ckpt::kFormat);
  MILES_RETURN_IF_ERROR(r.get(j, "format_version", "format_version", &version));
  if (version != kTrainCheckpointFormatVersion)
    return r.error("format_version", "is " + std::to_string(version) + "; this build reads " +
                                         std::to_string(kTrainCheckpointFormatVersion));
  MILES_ASSIGN_OR_RETURN(const json* opt, r.at(j, "optimizer", "optimizer"));
  MILES_RETURN_IF_ERROR(r.get(*opt, "steps", "optimizer.steps", &steps));
  if (steps < 0) return r.error("optimizer.steps", "must be >= 0");
  MILES_ASSIGN_OR_RETURN(TrainState state, read_train_state(j, r));
  MILES_RETURN_IF_ERROR(check_config(dir + "/" + ckpt::kConfigFile, trainer.model_config()));
  MILES_ASSIGN_OR_RETURN(const json* tensors, r.at(j, "tensors", "tensors"));
  const auto& layout = trainer.params().layout_ptr();
  MILES_ASSIGN_OR_RETURN(Recorded rec, check_layout(*tensors, *layout, r));

  FlatTensors params(layout), m(layout), v(layout);
  const std::string model_path = dir + "/" + ckpt::kModelFile;
  MILES_ASSIGN_OR_RETURN(const TensorMap model_stored, read_safetensors(model_path));
  MILES_ASSIGN_OR_RETURN(const TensorMap model_file,
                         from_hf_names(trainer.model_config(), model_stored));  // Phi-3's fused
  MILES_RETURN_IF_ERROR(copy_verified(model_file, model_path, "", rec.sha, params));
  MILES_RETURN_IF_ERROR(check_no_extra(model_file, model_path, {""}, *layout));
  const std::string opt_path = dir + "/" + ckpt::kOptimizerFile;
  MILES_ASSIGN_OR_RETURN(const TensorMap opt_file, read_safetensors(opt_path));
  MILES_RETURN_IF_ERROR(copy_verified(opt_file, opt_path, ckpt::kExpAvg, rec.exp_avg_sha, m));
  MILES_RETURN_IF_ERROR(copy_verified(opt_file, opt_path, ckpt::kExpAvgSq, rec.exp_avg_sq_sha, v));
  MILES_RETURN_IF_ERROR(
      check_no_extra(opt_file, opt_path, {ckpt::kExpAvg, ckpt::kExpAvgSq}, *layout));
  MILES_ASSIGN_OR_RETURN(const std::optional<DraftTrainState> draft,
                         read_draft(dir, j, r, trainer));

  // Every check passed: commit.
  std::ranges::copy(std::as_const(params).all(), trainer.mutable_params().all().begin());
  std::ranges::copy(std::as_const(m).all(), trainer.optimizer().exp_avg().all().begin());
  std::ranges::copy(std::as_const(v).all(), trainer.optimizer().exp_avg_sq().all().begin());
  trainer.optimizer().set_steps(steps);
  MILES_RETURN_IF_ERROR(trainer.reload_model());
  if (draft) MILES_RETURN_IF_ERROR(trainer.restore_draft(*draft));
  return state;
}

}  // namespace miles
