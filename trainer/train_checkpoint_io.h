// Private to the trainer's checkpoints: durable small-file IO and the names of a checkpoint's
// files.
//
// Why: save and load agree on file names in one place, and every byte a checkpoint holds is
// fsynced before the directory that holds it is renamed into place.
#pragma once

#include <string>

#include "miles/durable_file.h"
#include "miles/status.h"

namespace miles::ckpt {

inline constexpr const char* kFormat = "miles.train_checkpoint";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kDraftFile = "draft.safetensors";  // with a draft head
inline constexpr const char* kDraftCounts = "counts";
inline constexpr const char* kStateFile = "trainer_state.json";  // written last
inline constexpr const char* kExpAvg = "exp_avg.";
inline constexpr const char* kExpAvgSq = "exp_avg_sq.";

// Durable writes, copies and directory fsyncs: miles/durable_file.h.
using ::miles::copy_file_synced;
using ::miles::sync_dir;
using ::miles::write_file_synced;
// The whole file; the error names it.
Result<std::string> read_file(const std::string& path);

}  // namespace miles::ckpt
