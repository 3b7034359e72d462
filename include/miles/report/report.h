// `miles report`: one self-contained HTML page (inline CSS and SVG, no script, no network) with
// the curves of a run, from RUN_DIR/metrics.jsonl and RUN_DIR/config.yaml.
//
// Why: metrics.jsonl is the record of a run; a page that opens anywhere (a laptop, a CI artifact,
// an air-gapped cluster) shows reward, lengths, step-time split, train-rollout mismatch,
// staleness and the optimizer's numbers without a notebook or a dashboard service.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "miles/status.h"
#include "report/metrics_table.h"

namespace miles::report {

struct ReportSummary {
  std::string path;  // the page written
  int64_t steps = 0;
  int plots = 0;    // charts drawn
  int skipped = 0;  // charts skipped for missing keys
};

// The sample dump's file names (RUN_DIR/samples, written by `miles run`): "step_N.jsonl", and
// the N of such a name (-1 for any other name).
std::string sample_dump_name(int64_t step);
int64_t sample_dump_step(const std::string& file_name);

// How a page is made besides its data.
struct PageOptions {
  // > 0: a live page (the run goes on): the browser reloads it every this many seconds.
  int refresh_seconds = 0;
  // RUN_DIR/samples/step_N.jsonl, newest step first (at most kSampleSteps): each step's first
  // samples as a table, the newest open, the others folded.
  static constexpr int kSampleSteps = 20;
  std::vector<std::pair<int64_t, std::string>> sample_steps;  // (step, the file's text)
};

// The page for a parsed table. config_yaml: the run's config text (shown escaped), if any.
std::string render_report_html(const MetricsTable& m, const std::string& run_dir,
                               const std::optional<std::string>& config_yaml,
                               ReportSummary* summary = nullptr, const PageOptions& page = {});

// Reads RUN_DIR/metrics.jsonl (required), RUN_DIR/config.yaml and the newest sample dump
// (optional) and writes the page to out_path (RUN_DIR/report.html when empty), whole (a temporary
// renamed): `miles run` rewrites it live (refresh_seconds > 0) after its steps.
Result<ReportSummary> write_report(const std::string& run_dir, const std::string& out_path,
                                   int refresh_seconds = 0);

// `miles report RUN_A RUN_B ...`: the runs overlaid, one line per run on each chart (reward, eval,
// lengths, truncation, |Δlogp|, losses, step time, throughput) against the rollout step, and a
// table of each run's steps, first and last rewards. Runs of different lengths share the axis.
// `runs`: (name, table) in the order given.
std::string render_comparison_html(const std::vector<std::pair<std::string, MetricsTable>>& runs,
                                   ReportSummary* summary = nullptr);
// Reads each RUN_DIR/metrics.jsonl and writes the page to out_path (default compare.html in the
// working directory), whole.
Result<ReportSummary> write_comparison(const std::vector<std::string>& run_dirs,
                                       const std::string& out_path);

}  // namespace miles::report
