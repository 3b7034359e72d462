// The comparison page (report.h): several runs overlaid, one line per run on each chart.
//
// Why: tuning a recipe means comparing runs (a learning rate, a group size, sync against
// one-step-off); one page with their curves on shared axes answers "which learned faster, which
// step was slower" without a dashboard service.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "miles/durable_file.h"
#include "miles/report/report.h"
#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace miles::report {
namespace {

using Runs = std::vector<std::pair<std::string, MetricsTable>>;

struct Metric {
  const char* key;
  const char* title;
  const char* y_label;
};

// What the comparison shows, in page order.
constexpr Metric kMetrics[] = {
    {"reward_mean", "Reward (mean over the step's samples)", "reward"},
    {"eval_reward_mean", "Evaluation reward (held-out prompts)", "reward"},
    {"eval_pass_at_1", "Evaluation pass@1", "pass@1"},
    {"response_length_mean", "Response length (mean tokens)", "tokens"},
    {"truncated_frac", "Truncated responses (hit max_new_tokens)", "fraction"},
    {"logp_abs_diff_max", "Max |trainer − engine logp| per step", "|Δlogp|"},
    {"loss", "Loss", "loss"},
    {"grad_norm", "Gradient norm", "norm"},
    {"entropy", "Policy entropy (mean over trained tokens)", "nats"},
    {"groups_filtered", "Groups filtered (no reward variance)", "groups"},
    {"time_step_s", "Step time", "seconds"},
    {"samples_per_s", "Throughput", "samples / s"},
};

// Every step any run has, ascending: the shared x axis.
std::vector<double> union_of_steps(const Runs& runs) {
  std::set<double> steps;
  for (const auto& [name, table] : runs)
    for (double s : table.step)
      if (std::isfinite(s)) steps.insert(s);
  return {steps.begin(), steps.end()};
}

// One run's column on the shared axis (NaN where it has no such step).
std::vector<double> on_axis(const MetricsTable& t, const std::string& key,
                            const std::vector<double>& x) {
  const std::vector<double> column = t.column(key);
  std::map<double, double> by_step;
  for (size_t i = 0; i < t.rows(); ++i) by_step[t.step[i]] = column[i];
  std::vector<double> y(x.size(), NAN);
  for (size_t i = 0; i < x.size(); ++i)
    if (auto it = by_step.find(x[i]); it != by_step.end()) y[i] = it->second;
  return y;
}

// Each run: steps, reward of its first and last steps (a fifth of the run each, at least one).
std::string runs_table(const Runs& runs) {
  std::string out =
      "<table class=\"summary\">\n<tr><th>run</th><th>steps</th><th>reward, first steps</th>"
      "<th>reward, last steps</th><th>mean step time</th></tr>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const MetricsTable& t = runs[r].second;
    const std::vector<double> reward = t.column("reward_mean");
    const size_t n = t.rows(), w = std::max<size_t>(1, n / 5);
    const std::string swatch =
        std::string("<span style=\"color:") + palette_color(r) + "\">&#9632;</span> ";
    out += "<tr><td>" + swatch + "<code>" + html_escape(runs[r].first) + "</code></td><td>" +
           std::to_string(n) + "</td><td>" + format_number(finite_mean(reward, 0, w)) +
           "</td><td>" + format_number(finite_mean(reward, n - w, n)) + "</td><td>" +
           format_number(finite_mean(t.column("time_step_s"), 0, n)) + " s</td></tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

std::string render_comparison_html(const Runs& runs, ReportSummary* summary) {
  const std::vector<double> x = union_of_steps(runs);
  std::string charts;
  int drawn = 0, skipped = 0;
  for (const Metric& metric : kMetrics) {
    std::vector<Series> series;
    for (size_t r = 0; r < runs.size(); ++r) {
      if (!runs[r].second.has(metric.key)) continue;
      series.push_back(
          Series{runs[r].first, on_axis(runs[r].second, metric.key, x), palette_color(r)});
    }
    if (series.empty()) {
      ++skipped;
      charts += "<p class=\"note skipped\">Skipped " + html_escape(metric.title) +
                ": no run has values for " + std::string(metric.key) + ".</p>\n";
      continue;
    }
    ++drawn;
    ChartText t{
        std::string("cmp-") + metric.key, metric.title, "rollout step", metric.y_label, 760, 300};
    charts += "<div class=\"figure\">\n" + line_chart(t, x, series);
    if (series.size() < runs.size())
      charts += "<p class=\"note\">" + std::to_string(runs.size() - series.size()) + " of " +
                std::to_string(runs.size()) + " runs have no " + metric.key + ".</p>\n";
    charts += "</div>\n";
  }
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>miles report: " + std::to_string(runs.size()) + " runs</title>\n<style>" +
         std::string(page_style()) + "</style>\n</head>\n<body>\n";
  out += "<h1>miles run comparison</h1>\n<p class=\"meta\">" + std::to_string(runs.size()) +
         " runs from their metrics.jsonl, one line per run, against the rollout step.</p>\n";
  out += runs_table(runs) + charts + "</body>\n</html>\n";
  if (summary) {
    summary->steps = static_cast<int64_t>(x.size());
    summary->plots = drawn;
    summary->skipped = skipped;
  }
  return out;
}

Result<ReportSummary> write_comparison(const std::vector<std::string>& run_dirs,
                                       const std::string& out_path) {
  namespace fs = std::filesystem;
  Runs runs;
  std::set<std::string> names;
  for (const std::string& dir : run_dirs) {
    const std::string metrics = (fs::path(dir) / "metrics.jsonl").string();
    std::error_code ec;
    if (!fs::exists(metrics, ec))
      return Status::Error(metrics + ": not found (is " + dir + " the run dir of `miles run`?)");
    MILES_ASSIGN_OR_RETURN(MetricsTable table, read_metrics_jsonl(metrics));
    // The run's name: its directory as given, unique (two "run" folders stay apart).
    std::string name = fs::path(dir).lexically_normal().string();
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    if (!names.insert(name).second) return Status::Error(dir + ": given twice");
    runs.emplace_back(name, std::move(table));
  }
  ReportSummary summary;
  const std::string html = render_comparison_html(runs, &summary);
  const std::string out = out_path.empty() ? "compare.html" : out_path;
  MILES_RETURN_IF_ERROR(write_file_synced(out + ".tmp", html));
  std::error_code ec;
  fs::rename(out + ".tmp", out, ec);
  if (ec) return Status::Error(out + ": cannot publish the page: " + ec.message());
  summary.path = out;
  return summary;
}

}  // namespace miles::report
