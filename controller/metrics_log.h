// MetricsLog: RUN_DIR/metrics.jsonl (one JSON object per rollout step, flushed per line) and the
// terminal progress display (a bar redrawn on a terminal, plus one log line per step).
//
// Why: a run must show what it is doing while it runs, and leave a machine-readable record that a
// resumed run continues (lines past the resumed step are dropped, so the file never holds two
// histories).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/controller/run_config.h"
#include "miles/status.h"

namespace miles::controller {

class MetricsLog {
 public:
  // resume_step >= 0: keep only lines with step <= it.
  static Result<std::unique_ptr<MetricsLog>> open(const std::string& path, Progress progress,
                                                  int64_t total, int64_t resume_step);
  ~MetricsLog();
  Status write(const nlohmann::json& step_metrics);
  // The log line of a step (stdout) and the bar (stderr, on a terminal).
  void show(int64_t step, const std::string& line);
  void message(const std::string& line);  // a line that does not disturb the bar

 private:
  void draw_bar();
  std::FILE* f_ = nullptr;
  bool bar_ = false, lines_ = true;
  int64_t total_ = 0, last_step_ = 0;
  std::string last_line_;
};

}  // namespace miles::controller
