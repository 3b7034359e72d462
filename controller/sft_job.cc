// SftJob (sft_job.h): set up (run dir, service, data, trainer group, logs), then one named stage
// after another per step: batch → train → log → checkpoint.
#include "miles/controller/sft_job.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "controller/job_runtime.h"
#include "controller/metrics_log.h"
#include "controller/tensorboard_log.h"
#include "miles/model.h"
#include "miles/trainer/sft_data.h"
#include "miles/trainer/train_checkpoint.h"

namespace miles::controller {

namespace {

using Clock = std::chrono::steady_clock;

// The model's vocabulary size, to check the data's token ids: from config.json when the model is
// an HF directory (without reading its weights), else from the llama2.c checkpoint.
Result<int64_t> model_vocab_size(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    MILES_ASSIGN_OR_RETURN(ModelConfig c, load_model_config(path + "/config.json"));
    return c.vocab_size;
  }
  MILES_ASSIGN_OR_RETURN(ModelFiles f, load_model_files(path));
  return f.config.vocab_size;
}

class SftJob {
 public:
  SftJob(const RunConfig& config, std::shared_ptr<const Tokenizer> tokenizer,
         const SftJobOptions& options)
      : cfg_(config),
        tokenizer_(std::move(tokenizer)),
        options_(options),
        rt_(config, [this](const std::string& s) { log_line(s); }) {}
  ~SftJob() { rt_.stop_service(); }

  Status setup();
  Result<SftSummary> run();

 private:
  Status load_data();
  Status start_trainer_group();
  Status open_logs();
  Status log_stage(const StepResult& r, double seconds);
  Status checkpoint_if_due(bool final_step);
  void log_line(const std::string& line);

  RunConfig cfg_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  SftJobOptions options_;
  JobRuntime rt_;
  std::vector<TrainSample> data_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<TensorBoardLog> tensorboard_;
  std::atomic<int64_t> step_{0};  // steps done (read by the service's status)
  int64_t first_step_ = 0;
};

void SftJob::log_line(const std::string& line) {
  if (metrics_) {
    metrics_->message("miles sft: " + line);
  } else {
    spdlog::info("miles sft: {}", line);
  }
}

Status SftJob::setup() {
  MILES_RETURN_IF_ERROR(rt_.make_run_dir());
  MILES_RETURN_IF_ERROR(load_data());  // before any rank starts: bad data is reported at once
  MILES_RETURN_IF_ERROR(rt_.start_service([this](v1::ControllerStatus* s) {
    s->set_rollout_step(step_.load());
    s->set_num_rollouts(cfg_.sft.steps);
    s->set_mode("sft");
    s->set_run_dir(cfg_.logging.run_dir);
  }));
  MILES_RETURN_IF_ERROR(start_trainer_group());
  return open_logs();
}

Status SftJob::load_data() {
  MILES_ASSIGN_OR_RETURN(int64_t vocab, model_vocab_size(cfg_.model.path));
  MILES_ASSIGN_OR_RETURN(data_, load_sft_jsonl(cfg_.sft.data, tokenizer_.get(), vocab,
                                               SftDataOptions{.max_len = cfg_.sft.max_len}));
  return Status::Ok();
}

Status SftJob::start_trainer_group() {
  MILES_ASSIGN_OR_RETURN(TrainState st, rt_.start_trainer_group());
  if (!cfg_.checkpoint.resume) return Status::Ok();
  if (st.step == 0) {
    log_line("nothing to resume in " + cfg_.checkpoint.dir + "; starting fresh");
  } else {
    first_step_ = st.step;
    step_ = st.step;
    log_line("resumed from " + cfg_.checkpoint.dir + "/" + checkpoint_dir_name(st.step) +
             " (step " + std::to_string(st.step) + ")");
  }
  return Status::Ok();
}

Status SftJob::open_logs() {
  MILES_ASSIGN_OR_RETURN(
      metrics_, MetricsLog::open(cfg_.logging.run_dir + "/metrics.jsonl",
                                 options_.json_lines ? Progress::kNone : cfg_.logging.progress,
                                 cfg_.sft.steps, cfg_.checkpoint.resume ? first_step_ : -1));
  if (cfg_.logging.tensorboard) {
    MILES_ASSIGN_OR_RETURN(tensorboard_,
                           TensorBoardLog::open(cfg_.logging.run_dir + "/tensorboard"));
  }
  return Status::Ok();
}

Result<SftSummary> SftJob::run() {
  SftSummary sum;
  sum.first_step = first_step_;
  for (int64_t step = first_step_; step < cfg_.sft.steps && !rt_.should_stop(); ++step) {
    const auto t0 = Clock::now();
    const std::vector<TrainSample> batch = sft_batch(data_, step, cfg_.trainer.global_batch_size);
    auto r = rt_.group().train_sft(batch);
    if (!r.ok()) return r.status().with_context("step " + std::to_string(step + 1));
    step_ = step + 1;
    if (step == first_step_) sum.first_loss = r->loss;
    sum.last_loss = r->loss;
    MILES_RETURN_IF_ERROR(log_stage(*r, std::chrono::duration<double>(Clock::now() - t0).count()));
    MILES_RETURN_IF_ERROR(checkpoint_if_due(step_ == cfg_.sft.steps || rt_.should_stop()));
  }
  sum.steps = step_;
  MILES_RETURN_IF_ERROR(rt_.stop_trainer_group());
  return sum;
}

Status SftJob::log_stage(const StepResult& r, double seconds) {
  nlohmann::json j;
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["grad_norm"] = r.grad_norm;
  j["lr"] = r.lr;
  j["tokens"] = r.tokens;
  j["step_time_s"] = seconds;
  MILES_RETURN_IF_ERROR(metrics_->write(j));
  if (tensorboard_) {
    for (const char* key : {"loss", "grad_norm", "lr", "tokens", "step_time_s"})
      MILES_RETURN_IF_ERROR(tensorboard_->scalar(r.step, key, j[key].get<double>()));
    MILES_RETURN_IF_ERROR(tensorboard_->flush());
  }
  if (options_.json_lines) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    return Status::Ok();
  }
  char line[160];
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  grad_norm %.4f  lr %.3g  %.2fs",
                static_cast<long long>(r.step), static_cast<long long>(cfg_.sft.steps), r.loss,
                r.grad_norm, r.lr, seconds);
  metrics_->show(r.step, line);
  return Status::Ok();
}

// The whole model (stages and shards gathered on every rank) saved by this process as
// checkpoint.dir/step_N: HF-loadable, with the tokenizer files of an HF model directory.
Status SftJob::checkpoint_if_due(bool final_step) {
  const CheckpointSection& c = cfg_.checkpoint;
  const int64_t done = step_;
  const bool due = (c.save_every > 0 && done % c.save_every == 0) ||
                   (final_step && (c.save_final || c.save_every > 0));
  if (!due) return Status::Ok();
  MILES_ASSIGN_OR_RETURN(const Trainer* full, rt_.group().full());
  TrainState st;
  st.step = done;
  st.data_position = done * cfg_.trainer.global_batch_size;
  SaveOptions so;
  if (std::filesystem::is_directory(cfg_.model.path)) so.tokenizer_dir = cfg_.model.path;
  so.overwrite = true;
  std::error_code ec;
  std::filesystem::create_directories(c.dir, ec);
  const std::string dir = c.dir + "/" + checkpoint_dir_name(done);
  MILES_RETURN_IF_ERROR(save_checkpoint(dir, *full, st, so));
  log_line("checkpoint " + dir);
  return Status::Ok();
}

}  // namespace

Result<SftSummary> run_sft_job(const RunConfig& config, std::shared_ptr<const Tokenizer> tokenizer,
                               const SftJobOptions& options) {
  SftJob job(config, std::move(tokenizer), options);
  MILES_RETURN_IF_ERROR(job.setup());
  return job.run();
}

}  // namespace miles::controller
