// SampleDump (sample_dump.h).
#include "controller/sample_dump.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "miles/durable_file.h"
#include "miles/report/report.h"

namespace miles::controller {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<int64_t> dumped_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const int64_t s = report::sample_dump_step(e.path().filename().string()); s >= 0)
      steps.push_back(s);
  std::sort(steps.begin(), steps.end());
  return steps;
}

json sample_line(int64_t step, const RolloutGroup& g, const RolloutSample& s,
                 const RlSampleData& data, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  for (const TokenOutput& t : s.tokens) {
    ids.push_back(t.id);
    logprobs.push_back(t.logprob);
    versions.push_back(t.weight_version);
  }
  json j = {{"step", step},
            {"position", g.position},
            {"prompt_row", g.prompt ? g.prompt->row : -1},
            {"prompt", g.prompt ? g.prompt->text : ""},
            {"label", g.prompt ? g.prompt->label : json()},
            {"index", s.index},
            {"response", s.response},
            {"response_ids", ids},
            {"finish_reason", s.finish_reason},
            {"reward", s.reward.score},
            {"reward_parts", s.reward.parts},
            {"advantage", data.advantages.empty() ? 0.0f : data.advantages.front()},
            {"logprobs", logprobs},
            {"weight_versions", versions},
            {"prompt_tokens", s.prompt_tokens},
            {"turns", s.turns}};
  if (!s.reward.error.empty()) j["reward_error"] = s.reward.error;
  if (!s.rollout_result.is_null()) j["rollout_result"] = s.rollout_result;
  if (s.failed()) j["rollout_error"] = s.rollout_error;
  if (!s.trajectory.empty()) j["trajectory_text"] = tok.decode(s.trajectory);
  return j;
}

Status publish(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  MILES_RETURN_IF_ERROR(write_file_synced(tmp, text));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::Error(path + ": cannot publish the sample dump: " + ec.message());
  return Status::Ok();
}

}  // namespace

Result<SampleDump> SampleDump::open(const std::string& run_dir, int64_t every, int64_t keep,
                                    int64_t resume_step) {
  SampleDump d;
  d.dir_ = run_dir + "/samples";
  d.every_ = every;
  d.keep_ = keep;
  if (every <= 0) return d;
  std::error_code ec;
  fs::create_directories(d.dir_, ec);
  if (ec) return Status::Error(d.dir_ + ": cannot create the samples folder: " + ec.message());
  if (resume_step >= 0)
    for (int64_t s : dumped_steps(d.dir_))
      if (s > resume_step) fs::remove(d.path_of(s), ec);
  return d;
}

std::string SampleDump::path_of(int64_t step) const {
  return dir_ + "/" + report::sample_dump_name(step);
}

Status SampleDump::write(int64_t step, const std::vector<RolloutGroup>& groups,
                         const TrainBatch& batch, const Tokenizer& tok) const {
  if (every_ <= 0 || step % every_ != 0) return Status::Ok();
  std::string text;
  size_t i = 0;
  for (const RolloutGroup& g : groups)
    for (const RolloutSample& s : g.samples) {
      const RlSampleData empty;
      const RlSampleData& data = i < batch.data.size() ? batch.data[i] : empty;
      text +=
          sample_line(step, g, s, data, tok).dump(-1, ' ', false, json::error_handler_t::replace);
      text += '\n';
      ++i;
    }
  MILES_RETURN_IF_ERROR(publish(path_of(step), text));
  return prune();
}

Status SampleDump::write_eval(const std::string& run_dir, int64_t step,
                              const std::vector<RolloutGroup>& groups, const Tokenizer& tok) {
  const std::string dir = run_dir + "/eval_samples";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create the eval samples folder: " + ec.message());
  std::string text;
  const RlSampleData none;
  for (const RolloutGroup& g : groups)
    for (const RolloutSample& s : g.samples) {
      json j = sample_line(step, g, s, none, tok);
      j.erase("advantage");  // not trained on
      text += j.dump(-1, ' ', false, json::error_handler_t::replace);
      text += '\n';
    }
  return publish(dir + "/" + report::sample_dump_name(step), text);
}

Status SampleDump::prune() const {
  if (keep_ <= 0) return Status::Ok();
  const std::vector<int64_t> steps = dumped_steps(dir_);
  std::error_code ec;
  for (size_t k = 0; k + static_cast<size_t>(keep_) < steps.size(); ++k) {
    fs::remove(path_of(steps[k]), ec);
    if (ec) return Status::Error(path_of(steps[k]) + ": cannot remove: " + ec.message());
  }
  return Status::Ok();
}

}  // namespace miles::controller
