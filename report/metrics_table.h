// MetricsTable: RUN_DIR/metrics.jsonl (one JSON object per rollout step, controller/rl_step.cc)
// read into columns of doubles, one per numeric key, for `miles report`.
//
// Why columns with NaN holes: lines from different versions or configs need not carry the same
// keys, and JSON null (what nlohmann writes for NaN) must not become 0. A plot skips the holes;
// a key that has no finite value at all counts as absent, so its plot is skipped with a note.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles::report {

struct MetricsTable {
  std::vector<double> step;                            // x of each row ("step", else row number)
  std::vector<std::string> keys;                       // numeric keys, in first-seen order
  std::map<std::string, std::vector<double>> columns;  // NaN where null, missing or not a number
  std::map<std::string, std::string> text;             // string-valued keys, first value ("mode")

  size_t rows() const { return step.size(); }
  // True when `key` has at least one finite value.
  bool has(const std::string& key) const;
  // The column of `key`; all NaN when absent.
  std::vector<double> column(const std::string& key) const;
  // The reward parts: keys reward_<name>_mean other than reward_mean itself, sorted.
  std::vector<std::string> reward_part_keys() const;
};

// Parses the text of a metrics.jsonl; `name` prefixes errors ("metrics.jsonl:7: ..."). Blank
// lines are skipped; no rows at all is an error.
Result<MetricsTable> parse_metrics_jsonl(std::string_view text, const std::string& name);
Result<MetricsTable> read_metrics_jsonl(const std::string& path);

}  // namespace miles::report
