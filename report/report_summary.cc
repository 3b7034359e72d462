// The summary table at the top of the report (report_sections.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace miles::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr size_t kEnds = 5;  // steps averaged at each end for the reward change

void row(std::string& out, const std::string& name, const std::string& value_html) {
  out += "<tr><th>" + html_escape(name) + "</th><td>" + value_html + "</td></tr>\n";
}

std::string missing(const std::string& key) {
  return "<span class=\"na\">n/a (no " + html_escape(key) + " in metrics.jsonl)</span>";
}

std::string seconds(double v) { return format_number(v) + " s"; }

std::string reward_row(const MetricsTable& m) {
  const std::vector<double> r = m.column("reward_mean");
  const size_t n = m.rows();
  const size_t k = std::min(kEnds, n);
  const double first = finite_mean(r, 0, k), last = finite_mean(r, n - k, n);
  std::string v = format_number(first) + " &rarr; " + format_number(last);
  if (std::isfinite(first) && std::isfinite(last)) {
    const double d = last - first;
    v += " <span class=\"" + std::string(d >= 0 ? "up" : "down") + "\">(" + (d >= 0 ? "+" : "") +
         format_number(d) + ")</span>";
  }
  if (n < 2 * kEnds) v += " <span class=\"na\">(fewer than 10 steps: the ends overlap)</span>";
  return v;
}

std::string time_row(const MetricsTable& m) {
  const size_t n = m.rows();
  const double step = finite_mean(m.column("time_step_s"), 0, n);
  std::string v = seconds(step);
  std::string split;
  for (const char* phase : {"generate", "train", "sync", "idle"}) {
    const std::string key = std::string("time_") + phase + "_s";
    if (!m.has(key)) continue;
    const double t = finite_mean(m.column(key), 0, n);
    split += std::string(split.empty() ? "" : ", ") + phase + " " + seconds(t);
    if (std::isfinite(step) && step > 0)
      split += " (" + format_number(std::round(1000 * t / step) / 10) + "%)";
  }
  if (!split.empty())
    v += " &mdash; " + split +
         " <span class=\"na\">(shares of the step time; phases overlap in the async modes)</span>";
  return v;
}

std::string mismatch_row(const MetricsTable& m) {
  const std::vector<double> d = m.column("logp_abs_diff_max");
  double best = kNaN, at = kNaN;
  for (size_t i = 0; i < d.size(); ++i) {
    if (std::isfinite(d[i]) && !(d[i] <= best)) {
      best = d[i];
      at = m.step[i];
    }
  }
  return format_number(best) + " (step " + format_number(at) + ")";
}

}  // namespace

double finite_mean(const std::vector<double>& v, size_t begin, size_t end) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = begin; i < end && i < v.size(); ++i) {
    if (!std::isfinite(v[i])) continue;
    sum += v[i];
    ++n;
  }
  return n ? sum / static_cast<double>(n) : kNaN;
}

double counter_total(const std::vector<double>& v) {
  double total = 0, prev = 0;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    total += x >= prev ? x - prev : x;
    prev = x;
  }
  return total;
}

std::string summary_table(const MetricsTable& m) {
  std::string out = "<table class=\"summary\">\n";
  const size_t n = m.rows();
  row(out, "steps",
      std::to_string(n) + " (step " + format_number(m.step.front()) + " to " +
          format_number(m.step.back()) + ")");
  if (auto it = m.text.find("mode"); it != m.text.end()) row(out, "mode", html_escape(it->second));
  const std::string reward = m.has("reward_mean") ? reward_row(m) : missing("reward_mean");
  row(out,
      "reward mean, first " + std::to_string(std::min(kEnds, n)) + " → last " +
          std::to_string(std::min(kEnds, n)) + " steps",
      reward);
  row(out, "mean step time and split", m.has("time_step_s") ? time_row(m) : missing("time_step_s"));
  row(out, "max |Δlogp| (train vs rollout)",
      m.has("logp_abs_diff_max") ? mismatch_row(m) : missing("logp_abs_diff_max"));
  if (m.has("spec_draft_tokens")) {  // per-step counts (rollout.speculative)
    auto sum = [&](const char* key) {
      double t = 0;
      for (double x : m.column(key))
        if (std::isfinite(x)) t += x;
      return t;
    };
    const double drafted = sum("spec_draft_tokens"), verifies = sum("spec_verifies");
    row(out, "speculative decoding: accepted / drafted, tokens per verify",
        format_number(drafted > 0 ? sum("spec_accepted_tokens") / drafted : 0) + ", " +
            format_number(verifies > 0 ? sum("spec_emitted_tokens") / verifies : 0));
  }
  if (m.has("draft_loss")) {  // rollout.speculative_draft_head: first → last step
    auto ends = [&](const char* key) {
      const std::vector<double> c = m.column(key);
      return format_number(c.front()) + " → " + format_number(c.back());
    };
    row(out, "draft head: loss, estimated acceptance at temperature 1 (first → last step)",
        ends("draft_loss") + ", " + ends("draft_accept"));
    // rollout.speculative_draft_ttt_length > 1: each further pass's acceptance, p tokens ahead.
    for (int p = 2; m.has("draft_accept_" + std::to_string(p)); ++p)
      row(out,
          "draft head: estimated acceptance " + std::to_string(p) +
              " tokens ahead, the drafts before right (first → last step)",
          ends(("draft_accept_" + std::to_string(p)).c_str()));
  }
  for (const char* key : {"engine_restarts", "groups_redispatched"}) {
    row(out, key, m.has(key) ? format_number(counter_total(m.column(key))) : missing(key));
  }
  out += "</table>\n";
  return out;
}

}  // namespace miles::report
