// The report page (report.h): head with inline CSS, summary, config, chart sections.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "miles/durable_file.h"
#include "miles/report/report.h"
#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace miles::report {
namespace {

constexpr const char* kStyle = R"css(
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
svg.chart { display: block; background: #fff; max-width: 100%; height: auto; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #333; }
svg.chart text.title { font-size: 13px; font-weight: 600; }
svg.chart text.tick { font-size: 10px; fill: #555; }
svg.chart line.grid { stroke: #e6e6e6; stroke-width: 1; }
svg.chart line.axis { stroke: #444; stroke-width: 1; }
)css";

}  // namespace

std::string render_report_html(const MetricsTable& m, const std::string& run_dir,
                               const std::optional<std::string>& config_yaml,
                               ReportSummary* summary) {
  int drawn = 0, skipped = 0;
  const std::string charts = chart_sections(m, drawn, skipped);
  const std::string dir = html_escape(run_dir);
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>miles report: " + dir + "</title>\n<style>" + std::string(kStyle) +
         "</style>\n</head>\n<body>\n";
  out += "<h1>miles run report</h1>\n<p class=\"meta\">Run directory <code>" + dir +
         "</code>: " + std::to_string(m.rows()) + " rollout step" + (m.rows() == 1 ? "" : "s") +
         " from metrics.jsonl. Hover a point or bar for its value.</p>\n";
  out += summary_table(m);
  if (config_yaml) {
    out += "<details id=\"config\">\n<summary>config.yaml (the resolved job config)</summary>\n";
    out += "<pre>" + html_escape(*config_yaml) + "</pre>\n</details>\n";
  } else {
    out += "<p class=\"note skipped\">No config.yaml in the run directory.</p>\n";
  }
  out += charts + "</body>\n</html>\n";
  if (summary) {
    summary->steps = static_cast<int64_t>(m.rows());
    summary->plots = drawn;
    summary->skipped = skipped;
  }
  return out;
}

Result<ReportSummary> write_report(const std::string& run_dir, const std::string& out_path) {
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
  ReportSummary summary;
  const std::string html = render_report_html(table, run_dir, config, &summary);
  const std::string out =
      out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  MILES_RETURN_IF_ERROR(write_file_synced(out, html));
  summary.path = out;
  return summary;
}

}  // namespace miles::report
