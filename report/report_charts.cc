// The chart sections of the report (report_sections.h): which metrics each chart shows, and a
// note in place of a chart whose keys metrics.jsonl lacks.
#include <cmath>
#include <string>
#include <vector>

#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace miles::report {
namespace {

const char* color(size_t i) { return palette_color(i); }

struct Sections {
  explicit Sections(const MetricsTable& table) : m(table) {}

  void begin(const std::string& id, const std::string& heading, const std::string& intro) {
    out += "<section id=\"sec-" + id + "\">\n<h2>" + html_escape(heading) + "</h2>\n";
    if (!intro.empty()) out += "<p class=\"intro\">" + intro + "</p>\n";
  }
  void end() { out += "</section>\n"; }

  // True when at least one key has a value; otherwise appends the skip note.
  bool need(const std::vector<std::string>& keys, const std::string& what) {
    for (const std::string& k : keys)
      if (m.has(k)) return true;
    std::string list;
    for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
    out += "<p class=\"note skipped\">Skipped " + html_escape(what) + ": metrics.jsonl has no " +
           "values for " + html_escape(list) + ".</p>\n";
    ++skipped;
    return false;
  }

  // The chart, and notes naming its keys that are absent or have steps without a value.
  void chart(const std::string& svg, const std::vector<std::string>& keys) {
    out += "<div class=\"figure\">\n" + svg;
    std::string gaps, absent;
    for (const std::string& k : keys) {
      if (!m.has(k)) {
        absent += (absent.empty() ? "" : ", ") + html_escape(k);
        continue;
      }
      size_t holes = 0;
      for (double v : m.column(k)) holes += !std::isfinite(v);
      if (holes > 0)
        gaps += (gaps.empty() ? "" : "; ") + html_escape(k) + " at " + std::to_string(holes) +
                " of " + std::to_string(m.rows()) + " steps";
    }
    if (!absent.empty())
      out += "<p class=\"note\">No values in metrics.jsonl for " + absent + ".</p>\n";
    if (!gaps.empty()) out += "<p class=\"note\">No value (null or missing): " + gaps + ".</p>\n";
    out += "</div>\n";
    ++drawn;
  }

  Series series(const std::string& key, const std::string& label, size_t c,
                bool dashed = false) const {
    return Series{label, m.column(key), color(c), dashed};
  }

  const MetricsTable& m;
  std::string out;
  int drawn = 0, skipped = 0;
};

ChartText text(const std::string& id, const std::string& title, const std::string& y_label,
               int width = 760, int height = 300) {
  return ChartText{id, title, "rollout step", y_label, width, height};
}

void reward(Sections& s) {
  const MetricsTable& m = s.m;
  s.begin("reward", "Reward",
          "Mean reward over the step's samples, the band is ± one standard "
          "deviation; dashed lines are the reward parts (reward_&lt;name&gt;_mean).");
  if (s.need({"reward_mean"}, "the reward chart")) {
    std::vector<Series> lines{s.series("reward_mean", "reward_mean", 0)};
    std::vector<Band> bands;
    if (m.has("reward_std")) {
      const std::vector<double> mean = m.column("reward_mean"), sd = m.column("reward_std");
      Band b{"± reward_std", {}, {}, color(0)};
      for (size_t i = 0; i < mean.size(); ++i) {
        b.lo.push_back(mean[i] - sd[i]);
        b.hi.push_back(mean[i] + sd[i]);
      }
      bands.push_back(std::move(b));
    }
    const std::vector<std::string> parts = m.reward_part_keys();
    for (size_t i = 0; i < parts.size(); ++i)
      lines.push_back(s.series(parts[i], parts[i], i + 1, true));
    std::vector<std::string> keys{"reward_mean", "reward_std"};
    keys.insert(keys.end(), parts.begin(), parts.end());
    s.chart(line_chart(text("reward", "Reward per step", "reward"), m.step, lines, bands), keys);
  }
  s.end();
}

void lengths(Sections& s) {
  s.begin("length", "Response length", "Tokens per response: mean and longest in the step.");
  const std::vector<std::string> keys{"response_length_mean", "response_length_max"};
  if (s.need(keys, "the response-length chart")) {
    s.chart(line_chart(text("length", "Response length per step", "tokens"), s.m.step,
                       {s.series(keys[0], "mean", 0), s.series(keys[1], "max", 1)}),
            keys);
  }
  s.end();
}

void step_time(Sections& s) {
  s.begin("time", "Step time",
          "Seconds per step in generate / train / sync / idle, stacked; the line is the wall time "
          "of the step (time_step_s). In the one-step-off and async modes generation overlaps "
          "training, so the stack can exceed the line.");
  const std::vector<std::string> keys{"time_generate_s", "time_train_s", "time_sync_s",
                                      "time_idle_s"};
  if (s.need(keys, "the step-time chart")) {
    std::vector<Series> layers;
    const char* names[] = {"generate", "train", "sync", "idle"};
    for (size_t i = 0; i < keys.size(); ++i) layers.push_back(s.series(keys[i], names[i], i));
    std::vector<Series> lines;
    if (s.m.has("time_step_s"))
      lines.push_back(Series{"step (wall)", s.m.column("time_step_s"), "#222222"});
    std::vector<std::string> all = keys;
    all.push_back("time_step_s");
    s.chart(
        stacked_bar_chart(text("time", "Step-time breakdown", "seconds"), s.m.step, layers, lines),
        all);
  }
  s.end();
}

void mismatch(Sections& s) {
  s.begin("mismatch", "Train–rollout mismatch",
          "|Δlogp| = |log-prob under the trainer − log-prob the rollout engine reported| over the "
          "step's response tokens: mean and max per step.");
  const std::vector<std::string> keys{"logp_abs_diff_mean", "logp_abs_diff_max"};
  if (s.need(keys, "the mismatch chart")) {
    s.chart(line_chart(text("mismatch", "|Δlogp| per step", "|Δlogp| (nats)"), s.m.step,
                       {s.series(keys[0], "mean", 0), s.series(keys[1], "max", 3)}),
            keys);
  }
  if (s.need({"logp_abs_diff_max"}, "the mismatch histogram")) {
    s.out +=
        "<p class=\"intro\">Histogram <em>over steps</em> of each step's largest |Δlogp| "
        "(logp_abs_diff_max): one count per step. metrics.jsonl holds no per-token values, "
        "so this is not a per-token distribution.</p>\n";
    s.chart(histogram_chart(ChartText{"mismatch-hist", "Per-step max |Δlogp|, over steps",
                                      "logp_abs_diff_max (nats)", "steps", 760, 260},
                            s.m.column("logp_abs_diff_max"), color(3)),
            {"logp_abs_diff_max"});
  }
  s.end();
}

void staleness(Sections& s) {
  s.begin("staleness", "Staleness",
          "Policy versions between the weights a sample was generated with and the weights it "
          "trains: mean and max over the step's samples (0 in the synchronous mode).");
  const std::vector<std::string> keys{"staleness_mean", "staleness_max"};
  if (s.need(keys, "the staleness chart")) {
    s.chart(line_chart(text("staleness", "Staleness per step", "versions"), s.m.step,
                       {s.series(keys[0], "mean", 0), s.series(keys[1], "max", 1)}),
            keys);
  }
  s.end();
}

// Held-out evaluations: only the steps that have one, joined by lines.
void evaluation(Sections& s) {
  s.begin("eval", "Evaluation",
          "Held-out prompts (the job's eval: section): mean reward, pass@1 and pass@k at the steps "
          "evaluated; eval.jsonl also holds the evaluation before step 1.");
  std::vector<std::string> keys{"eval_reward_mean", "eval_pass_at_1"};
  for (const std::string& k : s.m.keys)
    if (k.rfind("eval_pass_at_", 0) == 0 && k != "eval_pass_at_1") keys.push_back(k);
  if (s.need(keys, "the evaluation chart")) {
    std::vector<std::vector<double>> columns;
    for (const std::string& k : keys) columns.push_back(s.m.column(k));
    std::vector<double> x;
    std::vector<Series> lines;
    for (size_t c = 0; c < keys.size(); ++c) lines.push_back(Series{keys[c], {}, color(c), c > 0});
    for (size_t i = 0; i < s.m.rows(); ++i) {
      if (!std::isfinite(columns[0][i])) continue;  // a step without an evaluation
      x.push_back(s.m.step[i]);
      for (size_t c = 0; c < keys.size(); ++c) lines[c].y.push_back(columns[c][i]);
    }
    s.out += "<div class=\"figure\">\n" +
             line_chart(text("eval", "Held-out evaluation", "reward / pass rate"), x, lines) +
             "</div>\n";
    ++s.drawn;
  }
  s.end();
}

// One small chart per key, side by side.
void grid(Sections& s, const std::vector<std::string>& keys) {
  s.out += "<div class=\"grid\">\n";
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    s.out += "<div class=\"cell\">\n";
    if (s.need({k}, "the " + k + " chart"))
      s.chart(line_chart(text(k, k, k, 376, 230), s.m.step, {s.series(k, k, i)}), {k});
    s.out += "</div>\n";
  }
  s.out += "</div>\n";
}

// What the rollout produced besides rewards: truncation, dynamic sampling, throughput.
void rollout(Sections& s) {
  s.begin("rollout", "Rollout",
          "Fraction of responses cut at max_new_tokens; groups drawn and dropped for lack of signal "
          "(dynamic sampling); generation and training throughput.");
  grid(s, {"truncated_frac", "groups_launched", "groups_filtered", "rollout_tokens_per_s",
           "train_tokens_per_s"});
  s.end();
}

void optimizer(Sections& s) {
  s.begin("train", "Optimization", "");
  grid(s, {"loss", "grad_norm", "entropy", "ppo_kl", "clipfrac", "lr"});
  s.end();
}

}  // namespace

std::string chart_sections(const MetricsTable& m, int& drawn, int& skipped) {
  Sections s(m);
  reward(s);
  if (m.has("eval_reward_mean")) evaluation(s);
  lengths(s);
  step_time(s);
  mismatch(s);
  staleness(s);
  optimizer(s);
  rollout(s);
  drawn = s.drawn;
  skipped = s.skipped;
  return s.out;
}

}  // namespace miles::report
