// `miles report RUN_DIR [--out FILE]`: one self-contained HTML page (inline SVG charts, no script,
// no network) from the run's metrics.jsonl and config.yaml; RUN_DIR/report.html by default.
// `miles report RUN_A RUN_B ...`: the runs overlaid on one page (compare.html by default).
//
// Why in the CLI: a run's record should be readable with the same binary that wrote it, on the
// machine it ran on, and the page should survive being copied anywhere
// (include/miles/report/report.h).
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "miles/report/report.h"

namespace miles::cli {
namespace {

struct ReportOptions {
  std::vector<std::string> run_dirs;
  std::string out;
};

int run_report(const ReportOptions& o) {
  const Result<report::ReportSummary> r = o.run_dirs.size() == 1
                                              ? report::write_report(o.run_dirs[0], o.out)
                                              : report::write_comparison(o.run_dirs, o.out);
  if (!r.ok()) {
    spdlog::error("miles report: {}", r.message());
    return 1;
  }
  std::printf("wrote %s: %lld step%s, %d charts", r->path.c_str(), static_cast<long long>(r->steps),
              r->steps == 1 ? "" : "s", r->plots);
  if (r->skipped > 0) std::printf(", %d skipped (keys missing from metrics.jsonl)", r->skipped);
  std::printf("\n");
  return 0;
}

}  // namespace

void register_report(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report",
      "Write an HTML page with the charts of a run (RUN_DIR/metrics.jsonl), or of several runs "
      "overlaid");
  sub->add_option("run_dirs", o->run_dirs,
                  "the run directory of `miles run`; several: one page comparing them")
      ->required();
  sub->add_option("--out", o->out,
                  "the page to write (default RUN_DIR/report.html; several runs: compare.html)");
  sub->callback([o] {
    if (int rc = run_report(*o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace miles::cli
