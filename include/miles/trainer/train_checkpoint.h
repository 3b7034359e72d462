// Trainer checkpoints: save and resume a training job bit for bit, as a Hugging Face model dir.
//
// Why: a resumed run must continue exactly where it stopped (docs/contracts.md §8: per-layer hashes
// equal after checkpoint resume), a crash while saving must never leave a directory that looks
// complete, and every checkpoint must be directly usable by the HF ecosystem
// (transformers.AutoModelForCausalLM.from_pretrained(dir)) and by our own loaders.
//
// A checkpoint directory (e.g. RUN/checkpoints/step_00000010):
//   config.json            HF config (model_config_to_hf_json), torch_dtype float32
//   model.safetensors      every parameter, float32, HF names, canonical layout order;
//                          metadata {"format": "pt"}
//   optimizer.safetensors  "exp_avg.<name>", "exp_avg_sq.<name>" (AdamW moments, float32)
//   trainer_state.json     written last: format + format_version, optimizer (steps, hyper-
//                          parameters), lr_schedule (position = optimizer steps, next lr, shape),
//                          train_state (TrainState), and per tensor in layout order
//                          {name, shape, sha256, exp_avg_sha256, exp_avg_sq_sha256}
//   tokenizer files        copied from SaveOptions::tokenizer_dir when given
//   draft.safetensors      with a co-trained draft head (TrainerConfig::draft): its trained
//   tensors,
//                          "exp_avg." / "exp_avg_sq." moments and "counts" (I64 [policy vocab],
//                          the id counts that choose its vocabulary); trainer_state.json's "draft"
//                          records its AdamW steps and the file's sha256. A trainer with a head
//                          resumes it exactly; one without ignores it; a checkpoint without one
//                          leaves the trainer's head new.
// The optimizer hyper-parameters and lr schedule shape are recorded for inspection only: a resumed
// trainer uses its own TrainerConfig; the schedule position is the restored optimizer step count.
// It is written as `dir.tmp-<pid>` (every file and the directory fsynced), then renamed to `dir`
// and the parent directory fsynced: `dir` exists only once it is complete.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "miles/status.h"
#include "miles/trainer/trainer.h"

namespace miles {

inline constexpr int kTrainCheckpointFormatVersion = 1;

// The job's state besides the trainer's, opaque to this module.
struct TrainState {
  int64_t step = 0;           // the job's step (e.g. rollout iteration) this checkpoint follows
  int64_t data_position = 0;  // index of the next unconsumed item of the data order
  // A counter-based RNG (e.g. Philox / splitmix over (seed, counter)): the stream is a pure
  // function of the seed, and `counter` is how many values were drawn, so (seed, counter)
  // restores the stream position exactly.
  uint64_t rng_seed = 0;
  uint64_t rng_counter = 0;
  // The caller's own state (e.g. the controller's) as a JSON document; "" for none. Stored as JSON
  // inside trainer_state.json; load gives back its compact serialization.
  std::string extra_json;
};

struct SaveOptions {
  // An HF model directory whose tokenizer files (tokenizer.json, tokenizer_config.json,
  // special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json,
  // chat_template.jinja, generation_config.json) are copied when present; "" for none.
  std::string tokenizer_dir;
  // Replace an existing complete checkpoint at `dir` (else that is an error).
  bool overwrite = false;
};

// Writes the trainer's parameters, optimizer state and `state` to `dir` atomically (see above).
Status save_checkpoint(const std::string& dir, const Trainer& trainer, const TrainState& state,
                       const SaveOptions& options = {});

// Restores parameters, AdamW moments and step count into `trainer` (built for the same model and
// layout, e.g. from the original weights) and rebuilds its model. Every tensor's sha256, name,
// shape and dtype and config.json are checked against trainer_state.json and the trainer before
// anything is changed; errors name the file and the tensor or key. Returns the saved TrainState.
Result<TrainState> load_checkpoint(const std::string& dir, Trainer& trainer);

// "step_00000010" for 10: the directory name of a checkpoint under RUN/checkpoints.
std::string checkpoint_dir_name(int64_t step);

// The path of the complete checkpoint `checkpoints_dir/step_<digits>` with the highest step
// (ignoring `*.tmp-*` leftovers and directories without trainer_state.json); an error when none.
Result<std::string> latest_checkpoint(const std::string& checkpoints_dir);

// Lower-case hex SHA-256 of the values' bytes as stored (float32, little-endian); the per-tensor
// hash of trainer_state.json, `miles check` and weight sync.
std::string tensor_sha256(std::span<const float> values);
std::string bytes_sha256(const void* data, size_t size);

}  // namespace miles
