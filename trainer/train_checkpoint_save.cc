// save_checkpoint and latest_checkpoint: a complete checkpoint directory appears atomically.
//
// Why: the files are written into `dir.tmp-<pid>`, each fsynced, trainer_state.json last; the
// directory is fsynced, renamed to `dir`, and the parent fsynced. A crash at any point leaves
// either no `dir` or a complete one (plus a `.tmp-*` leftover that latest_checkpoint ignores and
// the next save with the same pid removes). Replacing a checkpoint (SaveOptions::overwrite) moves
// the old one to `dir.old-<pid>` for the instant between the two renames.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "miles/hf_names.h"
#include "miles/json_text.h"
#include "miles/trainer/train_checkpoint.h"
#include "nlohmann/json.hpp"
#include "trainer/train_checkpoint_io.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

const char* const kTokenizerFiles[] = {"tokenizer.json",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "tokenizer.model",
                                       "vocab.json",
                                       "merges.txt",
                                       "added_tokens.json",
                                       "chat_template.jinja",
                                       "generation_config.json"};

std::vector<std::pair<std::string, Tensor>> views(const FlatTensors& t, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamSpec& s : t.layout().specs())
    out.emplace_back(prefix + s.name,
                     Tensor::view(DType::kF32, s.shape, t.get(s.name).data(), nullptr));
  return out;
}

// The draft head's file (trained tensors, moments, id counts); returns its sha256 for
// trainer_state.json.
Result<std::string> write_draft(const std::string& path, const DraftTrainState& d) {
  std::vector<std::pair<std::string, Tensor>> tensors = views(d.params, "");
  for (auto& v : views(d.exp_avg, ckpt::kExpAvg)) tensors.push_back(std::move(v));
  for (auto& v : views(d.exp_avg_sq, ckpt::kExpAvgSq)) tensors.push_back(std::move(v));
  tensors.emplace_back(
      ckpt::kDraftCounts,
      Tensor::view(DType::kI64, {static_cast<int64_t>(d.counts.size())}, d.counts.data(), nullptr));
  MILES_RETURN_IF_ERROR(write_safetensors(path, tensors, {{"format", "pt"}}));
  MILES_ASSIGN_OR_RETURN(const std::string bytes, ckpt::read_file(path));
  return bytes_sha256(bytes.data(), bytes.size());
}

ordered_json state_json(const Trainer& trainer, const TrainState& state, const ordered_json& extra,
                        const ordered_json& draft) {
  const AdamW& opt = trainer.optimizer();
  const AdamWConfig& oc = opt.config();
  const LrSchedule& lr = trainer.config().lr;
  ordered_json j;
  j["format"] = ckpt::kFormat;
  j["format_version"] = kTrainCheckpointFormatVersion;
  j["optimizer"] = {{"name", "adamw"},
                    {"steps", opt.steps()},
                    {"beta1", oc.beta1},
                    {"beta2", oc.beta2},
                    {"eps", oc.eps},
                    {"weight_decay", oc.weight_decay},
                    {"clip_grad_norm", oc.clip_grad_norm}};
  j["lr_schedule"] = {{"position", opt.steps()},
                      {"next_lr", lr.at(opt.steps())},
                      {"lr", lr.lr},
                      {"min_lr", lr.min_lr},
                      {"warmup_steps", lr.warmup_steps},
                      {"total_steps", lr.total_steps},
                      {"decay", lr.decay == LrSchedule::Decay::kCosine ? "cosine" : "constant"}};
  j["train_state"] = {{"step", state.step},
                      {"data_position", state.data_position},
                      {"rng", {{"seed", state.rng_seed}, {"counter", state.rng_counter}}},
                      {"extra", extra}};
  ordered_json tensors = ordered_json::array();
  const FlatTensors& p = trainer.params();
  for (const ParamSpec& s : p.layout().specs())
    tensors.push_back({{"name", s.name},
                       {"shape", s.shape},
                       {"sha256", tensor_sha256(p.get(s.name))},
                       {"exp_avg_sha256", tensor_sha256(opt.exp_avg().get(s.name))},
                       {"exp_avg_sq_sha256", tensor_sha256(opt.exp_avg_sq().get(s.name))}});
  j["tensors"] = std::move(tensors);
  if (!draft.is_null()) j["draft"] = draft;
  return j;
}

// Every file of the checkpoint into the (new, empty) directory `tmp`.
Status write_contents(const std::string& tmp, const Trainer& trainer, const TrainState& state,
                      const ordered_json& extra, const SaveOptions& options) {
  const std::map<std::string, std::string> pt{{"format", "pt"}};
  // Under the checkpoint's own names (Phi-3's projections fused), so that transformers loads it.
  MILES_RETURN_IF_ERROR(
      write_safetensors(tmp + "/" + ckpt::kModelFile,
                        to_hf_names(trainer.model_config(), views(trainer.params(), "")), pt));
  std::vector<std::pair<std::string, Tensor>> moments =
      views(trainer.optimizer().exp_avg(), ckpt::kExpAvg);
  for (auto& v : views(trainer.optimizer().exp_avg_sq(), ckpt::kExpAvgSq))
    moments.push_back(std::move(v));
  MILES_RETURN_IF_ERROR(write_safetensors(tmp + "/" + ckpt::kOptimizerFile, moments, pt));
  MILES_RETURN_IF_ERROR(ckpt::write_file_synced(tmp + "/" + ckpt::kConfigFile,
                                                model_config_to_hf_json(trainer.model_config())));
  if (!options.tokenizer_dir.empty()) {
    if (!fs::is_directory(options.tokenizer_dir))
      return Status::Error(options.tokenizer_dir + ": tokenizer directory not found");
    for (const char* name : kTokenizerFiles) {
      const std::string from = options.tokenizer_dir + "/" + name;
      if (fs::is_regular_file(from))
        MILES_RETURN_IF_ERROR(ckpt::copy_file_synced(from, tmp + "/" + name));
    }
  }
  ordered_json draft = nullptr;
  if (trainer.draft()) {
    MILES_ASSIGN_OR_RETURN(const DraftTrainState d, trainer.draft_state());
    MILES_ASSIGN_OR_RETURN(const std::string sha, write_draft(tmp + "/" + ckpt::kDraftFile, d));
    draft = {{"file", ckpt::kDraftFile}, {"steps", d.steps}, {"sha256", sha}};
  }
  return ckpt::write_file_synced(tmp + "/" + ckpt::kStateFile,
                                 state_json(trainer, state, extra, draft).dump(2) + "\n");
}

// Moves the finished `tmp` to `dir` (replacing an old checkpoint when `overwrite`).
Status publish(const std::string& tmp, const std::string& dir, const std::string& parent) {
  std::error_code ec;
  std::string old;
  if (fs::exists(dir)) {
    old = dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    if (std::rename(dir.c_str(), old.c_str()) != 0)
      return Status::Error(dir + ": cannot move the old checkpoint aside: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
    const Status s =
        Status::Error(dir + ": cannot rename " + tmp + " into place: " + std::strerror(errno));
    if (!old.empty()) std::rename(old.c_str(), dir.c_str());  // put the old checkpoint back
    return s;
  }
  MILES_RETURN_IF_ERROR(ckpt::sync_dir(parent));
  if (!old.empty()) fs::remove_all(old, ec);
  return Status::Ok();
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

Status save_checkpoint(const std::string& dir_in, const Trainer& trainer, const TrainState& state,
                       const SaveOptions& options) {
  fs::path target = fs::path(dir_in).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "a/b/" -> "a/b"
  if (target.empty()) return Status::Error("save_checkpoint: empty directory name");
  const std::string dir = target.string();
  ordered_json extra = nullptr;
  if (!state.extra_json.empty()) {
    auto parsed = parse_json_text<ordered_json>(state.extra_json);
    if (!parsed.ok())
      return Status::Error(dir + ": TrainState.extra_json is not valid JSON: " + parsed.message());
    extra = std::move(parsed).value();
  }
  if (fs::exists(target) && !options.overwrite)
    return Status::Error(dir +
                         (fs::exists(target / ckpt::kStateFile)
                              ? ": a checkpoint already exists there"
                              : ": already exists and is not a checkpoint") +
                         " (SaveOptions::overwrite replaces it)");
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return Status::Error(parent.string() + ": cannot create: " + ec.message());
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);  // a leftover of a crashed save by a process with our pid
  if (!fs::create_directory(tmp, ec))
    return Status::Error(tmp + ": cannot create: " + ec.message());
  Status s = write_contents(tmp, trainer, state, extra, options);
  if (s.ok()) s = ckpt::sync_dir(tmp);
  if (s.ok()) s = publish(tmp, dir, parent.string());
  if (!s.ok()) fs::remove_all(tmp, ec);
  return s;
}

Result<std::string> latest_checkpoint(const std::string& checkpoints_dir) {
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir, ec);
  if (ec) return Status::Error(checkpoints_dir + ": cannot list: " + ec.message());
  static const std::regex kName("step_([0-9]{1,18})");
  int64_t best = -1;
  std::string best_path;
  for (const fs::directory_entry& e : it) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, kName) || !e.is_directory(ec)) continue;
    if (!fs::is_regular_file(e.path() / ckpt::kStateFile, ec)) continue;  // not complete
    const int64_t step = std::stoll(m[1].str());
    if (step > best) {
      best = step;
      best_path = e.path().string();
    }
  }
  if (best < 0) return Status::Error(checkpoints_dir + ": no complete checkpoint (step_*)");
  return best_path;
}

}  // namespace miles
