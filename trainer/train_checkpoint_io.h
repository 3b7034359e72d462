// Private to the trainer's checkpoints: durable small-file IO and the names of a checkpoint's
// files.
//
// Why: save and load agree on file names in one place, and every byte a checkpoint holds is
// fsynced before the directory that holds it is renamed into place.
#pragma once

#include <string>

#include "miles/status.h"

namespace miles::ckpt {

inline constexpr const char* kFormat = "miles.train_checkpoint";
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kStateFile = "trainer_state.json";  // written last
inline constexpr const char* kExpAvg = "exp_avg.";
inline constexpr const char* kExpAvgSq = "exp_avg_sq.";

// Writes `text` to `path` (created or truncated) and fsyncs it.
Status write_file_synced(const std::string& path, const std::string& text);
// Copies `from` to `to` and fsyncs the copy.
Status copy_file_synced(const std::string& from, const std::string& to);
// fsyncs the directory `dir` itself (its entries: created, renamed files).
Status sync_dir(const std::string& dir);
// The whole file; the error names it.
Result<std::string> read_file(const std::string& path);

}  // namespace miles::ckpt
