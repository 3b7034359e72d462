// The parts of the report page (report.h): the summary table and the chart sections.
//
// Why separate: the page skeleton (report_page.cc) stays small; each part reads only the table.
#pragma once

#include <string>
#include <vector>

#include "report/metrics_table.h"

namespace miles::report {

// The page's inline CSS (report_page.cc), shared by the run page and the comparison page.
const char* page_style();

// The summary table: steps, reward first vs last steps, step time and its split, max |Δlogp|,
// engine restarts.
std::string summary_table(const MetricsTable& m);

// The chart sections; counts drawn and skipped charts.
// (The comparison page, report_compare.cc, draws its own: one line per run.)
std::string chart_sections(const MetricsTable& m, int& drawn, int& skipped);

// Mean of the finite values in [begin, end) of v; NaN when none.
double finite_mean(const std::vector<double>& v, size_t begin, size_t end);
// Increments of a cumulative counter, summed, a decrease counting as a restart from 0 (a resumed
// run's new process).
double counter_total(const std::vector<double>& v);

}  // namespace miles::report
