// The report page (report.h): head with inline CSS, summary, config, chart sections.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "miles/durable_file.h"
#include "miles/json_text.h"
#include "miles/report/report.h"
#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace miles::report {
namespace {

constexpr const char* kStyleText = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
.meta, .intro, .note { color: #555; margin: 4px 0; }
.note { font-size: 12.5px; }
.skipped { color: #a15c00; }
table.summary { border-collapse: collapse; margin: 12px 0; }
table.summary th { text-align: left; font-weight: 600; padding: 4px 16px 4px 0; vertical-align: top;
                   white-space: nowrap; }
table.summary td { padding: 4px 0; }
.na { color: #888; font-size: 12.5px; }
.up { color: #1a7f37; } .down { color: #c0392b; }
details { margin: 12px 0; } summary { cursor: pointer; font-weight: 600; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: 10px; overflow: auto;
      font-size: 12.5px; }
.grid { display: flex; flex-wrap: wrap; gap: 8px 16px; }
.cell { width: 380px; }
table.samples { border-collapse: collapse; font-size: 12.5px; }
table.samples th, table.samples td { border: 1px solid #ddd; padding: 3px 6px; text-align: left;
                                     vertical-align: top; white-space: pre-wrap; }
svg.chart { display: block; background: #fff; max-width: 100%; height: auto; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #333; }
svg.chart text.title { font-size: 13px; font-weight: 600; }
svg.chart text.tick { font-size: 10px; fill: #555; }
svg.chart line.grid { stroke: #e6e6e6; stroke-width: 1; }
svg.chart line.axis { stroke: #444; stroke-width: 1; }
)css";

}  // namespace

const char* page_style() { return kStyleText; }

namespace {

// One step's samples (RUN_DIR/samples/step_N.jsonl): prompt, response, reward, advantage of the
// first few, in a <details> block (open for the newest step). Empty when the file has none.
std::string step_samples(const std::string& jsonl, int64_t step, bool open) {
  constexpr int kShown = 12;
  std::string rows;
  std::istringstream in(jsonl);
  std::string line;
  int shown = 0, total = 0;
  while (std::getline(in, line)) {
    const auto j = parse_json_or_discarded(line);
    if (!j.is_object()) continue;
    ++total;
    if (shown == kShown) continue;
    ++shown;
    auto text = [&](const char* k) {
      return j.contains(k) && j[k].is_string() ? html_escape(j[k].get<std::string>()) : "";
    };
    auto number = [&](const char* k) {
      return j.contains(k) && j[k].is_number() ? format_number(j[k].get<double>()) : "";
    };
    rows += "<tr><td>" + text("prompt") + "</td><td>" + text("response") + "</td><td>" +
            number("reward") + "</td><td>" + number("advantage") + "</td></tr>\n";
  }
  if (total == 0) return "";
  const std::string n = std::to_string(step);
  return std::string("<details") + (open ? " open" : "") + " id=\"samples-step-" + n +
         "\">\n<summary>Step " + n + ": the first " + std::to_string(shown) + " of " +
         std::to_string(total) + " samples trained at step " + n + " (samples/step_" + n +
         ".jsonl holds them all)</summary>\n<table class=\"samples\">\n<tr><th>prompt</th>"
         "<th>response</th><th>reward</th><th>advantage</th></tr>\n" +
         rows + "</table>\n</details>\n";
}

// The sample texts of every dumped step, newest first.
std::string samples_section(const std::vector<std::pair<int64_t, std::string>>& steps) {
  std::string body;
  for (const auto& [step, jsonl] : steps) body += step_samples(jsonl, step, body.empty());
  if (body.empty()) return "";
  return "<section id=\"sec-samples\">\n<h2>Samples</h2>\n<p class=\"intro\">What the policy "
         "wrote, step by step (the newest open; click a step to unfold it).</p>\n" +
         body + "</section>\n";
}

// RUN_DIR/samples/step_N.jsonl, newest first, at most `limit` of them: (N, text).
std::vector<std::pair<int64_t, std::string>> sample_dumps(const std::string& run_dir, int limit) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "samples", ec))
    if (int64_t n = sample_dump_step(e.path().filename().string()); n >= 0) steps.push_back(n);
  std::sort(steps.rbegin(), steps.rend());
  if (static_cast<int>(steps.size()) > limit) steps.resize(static_cast<size_t>(limit));
  std::vector<std::pair<int64_t, std::string>> out;
  for (int64_t n : steps) {
    std::ifstream f(fs::path(run_dir) / "samples" / sample_dump_name(n), std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    out.emplace_back(n, s.str());
  }
  return out;
}

}  // namespace

std::string sample_dump_name(int64_t step) { return "step_" + std::to_string(step) + ".jsonl"; }

int64_t sample_dump_step(const std::string& name) {
  const std::string prefix = "step_", suffix = ".jsonl";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 15 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string render_report_html(const MetricsTable& m, const std::string& run_dir,
                               const std::optional<std::string>& config_yaml,
                               ReportSummary* summary, const PageOptions& page) {
  int drawn = 0, skipped = 0;
  const std::string charts = chart_sections(m, drawn, skipped);
  const std::string dir = html_escape(run_dir);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  if (page.refresh_seconds > 0)
    out +=
        "<meta http-equiv=\"refresh\" content=\"" + std::to_string(page.refresh_seconds) + "\">\n";
  out += "<title>miles report: " + dir + "</title>\n<style>" + std::string(page_style()) +
         "</style>\n</head>\n<body>\n";
  out += "<h1>miles run report</h1>\n<p class=\"meta\">Run directory <code>" + dir +
         "</code>: " + std::to_string(m.rows()) + " rollout step" + (m.rows() == 1 ? "" : "s") +
         " from metrics.jsonl. Hover a point or bar for its value.</p>\n";
  if (page.refresh_seconds > 0)
    out += "<p class=\"meta live\">Live: the run goes on; this page reloads every " +
           std::to_string(page.refresh_seconds) + " s.</p>\n";
  out += summary_table(m);
  if (config_yaml) {
    out += "<details id=\"config\">\n<summary>config.yaml (the resolved job config)</summary>\n";
    out += "<pre>" + html_escape(*config_yaml) + "</pre>\n</details>\n";
  } else {
    out += "<p class=\"note skipped\">No config.yaml in the run directory.</p>\n";
  }
  out += charts;
  out += samples_section(page.sample_steps);
  out += "</body>\n</html>\n";
  if (summary) {
    summary->steps = static_cast<int64_t>(m.rows());
    summary->plots = drawn;
    summary->skipped = skipped;
  }
  return out;
}

Result<ReportSummary> write_report(const std::string& run_dir, const std::string& out_path,
                                   int refresh_seconds) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return Status::Error(run_dir + ": not a directory");
  const std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  if (!fs::exists(metrics, ec))
    return Status::Error(metrics + ": not found (is " + run_dir + " the run dir of `miles run`?)");
  MILES_ASSIGN_OR_RETURN(const MetricsTable table, read_metrics_jsonl(metrics));
  std::optional<std::string> config;
  if (std::ifstream f(fs::path(run_dir) / "config.yaml", std::ios::binary); f) {
    std::ostringstream s;
    s << f.rdbuf();
    config = s.str();
  }
  PageOptions page;
  page.refresh_seconds = refresh_seconds;
  page.sample_steps = sample_dumps(run_dir, PageOptions::kSampleSteps);
  ReportSummary summary;
  const std::string html = render_report_html(table, run_dir, config, &summary, page);
  const std::string out =
      out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  // Whole or not at all: a browser reloading a live page never reads half of it.
  MILES_RETURN_IF_ERROR(write_file_synced(out + ".tmp", html));
  fs::rename(out + ".tmp", out, ec);
  if (ec) return Status::Error(out + ": cannot publish the report: " + ec.message());
  summary.path = out;
  return summary;
}

}  // namespace miles::report
