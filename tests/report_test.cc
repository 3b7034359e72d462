// `miles report`: the page from a hand-written metrics.jsonl (10 steps with the keys of
// controller/rl_step.cc) is self-contained, has a chart per plot and the escaped config; one step,
// nulls and missing keys give charts or notes, never NaN in the SVG; an empty file, a missing file
// and a malformed line are errors naming the file and line. Headless Chromium renders the page
// with no console message (SVG attribute errors and script errors both land there).
#include "miles/report/report.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "miles/check.h"
#include "report/metrics_table.h"
#include "report/report_sections.h"
#include "report/svg_plot.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every chart the page can draw, by svg id (plot-<id>).
const std::vector<std::string> kCharts = {"reward",
                                          "length",
                                          "time",
                                          "mismatch",
                                          "mismatch-hist",
                                          "staleness",
                                          "loss",
                                          "grad_norm",
                                          "ppo_kl",
                                          "clipfrac",
                                          "lr",
                                          "entropy",
                                          "truncated_frac",
                                          "groups_launched",
                                          "groups_filtered",
                                          "rollout_tokens_per_s",
                                          "train_tokens_per_s"};

// A metrics.jsonl line like the ones controller/rl_step.cc writes (async mode, two reward parts).
json step_line(int step) {
  const double s = step;
  return json{{"step", step},
              {"weight_version", step},
              {"mode", "one_step_off"},
              {"samples", 64},
              {"groups", 8},
              {"reward_mean", 0.2 + 0.05 * s},
              {"reward_std", 0.3 - 0.01 * s},
              {"reward_errors", 0},
              {"response_length_mean", 180.0 - 4.5 * s},
              {"response_length_max", 512 - 10 * step},
              {"truncated_frac", 0.05},
              {"staleness_mean", step > 1 ? 0.9 : 0.0},
              {"staleness_max", step > 1 ? 1 : 0},
              {"loss", -0.02 + 0.001 * s},
              {"grad_norm", 1.4 / std::sqrt(s)},
              {"lr", 1e-6},
              {"ppo_kl", 1e-4 * s},
              {"entropy", 1.2 - 0.02 * s},
              {"clipfrac", 0.002 * (step % 3)},
              {"logp_abs_diff_mean", 0.004 + 0.0002 * s},
              {"logp_abs_diff_max", 0.1 + 0.03 * (step % 4)},
              {"logp_diff_nonzero_frac", 0.6},
              {"time_step_s", 7.5 + 0.1 * s},
              {"time_generate_s", 5.0 + 0.1 * s},
              {"time_train_s", 2.1},
              {"time_sync_s", 0.3},
              {"time_idle_s", 0.1},
              {"rollout_tokens_per_s", 2300.0},
              {"train_tokens_per_s", 900.0},
              {"groups_launched", 12},
              {"groups_filtered", step % 3},
              {"engine_failures", step >= 4 ? 1 : 0},
              {"engine_restarts", step >= 4 ? 1 : 0},
              {"groups_redispatched", step >= 4 ? 2 : 0},
              {"reward_correct_mean", 0.15 + 0.05 * s},
              {"reward_format_mean", 0.05}};
}

// The config text: HTML specials and a URL that is text, not a resource.
constexpr const char* kConfig =
    "model:\n  path: models/smollm2-135m-instruct\n"
    "rewards:\n  - name: format\n    regex: \"<answer>(.*)</answer>\"  # "
    "<script>alert(\"x\")</script> & 'q'\n"
    "  - name: judge\n    url: http://127.0.0.1:8000/score\n";

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "miles_report_XXXXXX").string();
    MILES_CHECK(::mkdtemp(t.data()) != nullptr, "mkdtemp");
    dir_ = t;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  void write_run(int steps) {
    std::string lines;
    for (int s = 1; s <= steps; ++s) lines += step_line(s).dump() + "\n";
    write("metrics.jsonl", lines);
    write("config.yaml", kConfig);
  }
  std::string read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  miles::test::CliRun report(const std::string& extra = "") {
    return miles::test::run_miles("report " + dir_.string() + extra);
  }
  fs::path dir_;
};

std::string html_escape_for_test(const std::string& s) { return miles::report::html_escape(s); }

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

// Each <svg ...>...</svg> of the page.
std::vector<std::string> svgs(const std::string& page) {
  std::vector<std::string> out;
  for (size_t i = page.find("<svg"); i != std::string::npos; i = page.find("<svg", i + 1))
    out.push_back(page.substr(i, page.find("</svg>", i) - i));
  return out;
}

TEST_F(ReportTest, SelfContainedPageWithEveryChartAndTheEscapedConfig) {
  write_run(10);
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("10 steps, 17 charts"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir_ / "report.html"));
  const std::string page = read(dir_ / "report.html");
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  for (const std::string& id : kCharts)
    EXPECT_EQ(count(page, "<svg id=\"plot-" + id + "\""), 1u) << id;
  EXPECT_EQ(count(page, "<svg"), kCharts.size());
  EXPECT_EQ(page.find("Skipped"), std::string::npos);
  // Self-contained: no element that loads anything, no remote reference of any kind.
  const std::regex remote(R"((src|href|xlink:href)\s*=\s*["']?\s*(https?:)?//|url\(|@import)",
                          std::regex::icase);
  EXPECT_FALSE(std::regex_search(page, remote));
  for (const char* tag : {"<script", "<link", "<img", "<iframe", "<object", "<embed"})
    EXPECT_EQ(page.find(tag), std::string::npos) << tag;
  // The config, escaped, in a collapsible block; its URL is text inside <pre>.
  EXPECT_NE(page.find("<details id=\"config\">"), std::string::npos);
  EXPECT_NE(page.find("&lt;answer&gt;(.*)&lt;/answer&gt;"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;"),
            std::string::npos);
  EXPECT_EQ(page.find("<answer>"), std::string::npos);
  EXPECT_EQ(count(page, "http://"), 1u);
  EXPECT_LT(page.find("http://"), page.find("</pre>"));
  EXPECT_GT(page.find("http://"), page.find("<pre>"));
  // Summary: reward 0.2 + 0.05 s averaged over steps 1-5 and 6-10, step time, mismatch, restarts.
  EXPECT_NE(page.find("0.35 &rarr; 0.6 <span class=\"up\">(+0.25)</span>"), std::string::npos);
  EXPECT_NE(page.find("8.05 s &mdash; generate 5.55 s (68.9%), train 2.1 s (26.1%)"),
            std::string::npos);
  EXPECT_NE(page.find("<th>max |Δlogp| (train vs rollout)</th><td>0.19 (step 3)</td>"),
            std::string::npos);
  EXPECT_NE(page.find("<th>engine_restarts</th><td>1</td>"), std::string::npos);
  EXPECT_NE(page.find("<th>mode</th><td>one_step_off</td>"), std::string::npos);
  // The reward chart has the band and both parts; the histogram says what it counts.
  const std::string reward = svgs(page)[0];
  EXPECT_NE(reward.find("<polygon class=\"band\""), std::string::npos);
  EXPECT_NE(reward.find(">reward_correct_mean</text>"), std::string::npos);
  EXPECT_NE(reward.find(">reward_format_mean</text>"), std::string::npos);
  EXPECT_NE(page.find("not a per-token distribution"), std::string::npos);
  // The time chart stacks four phases per step: 40 bars.
  const std::string time = svgs(page)[2];
  EXPECT_EQ(count(time, "<rect x="), 40u + 4u);  // and four legend swatches
}

// Evaluations (eval: section) on some steps: one chart of only those steps, joined.
TEST_F(ReportTest, EvaluationCurveShowsTheEvaluatedStepsOnly) {
  std::string lines;
  for (int s = 1; s <= 6; ++s) {
    json j = step_line(s);
    if (s % 2 == 0) {
      j["eval_reward_mean"] = 0.1 * s;
      j["eval_pass_at_1"] = 0.05 * s;
      j["eval_pass_at_4"] = 0.15 * s;
    }
    lines += j.dump() + "\n";
  }
  write("metrics.jsonl", lines);
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("6 steps, 18 charts"), std::string::npos) << r.out;
  const std::string page = read(dir_ / "report.html");
  const std::string eval = svgs(page)[1];
  EXPECT_NE(eval.find("id=\"plot-eval\""), std::string::npos);
  for (const char* k : {"eval_reward_mean", "eval_pass_at_1", "eval_pass_at_4"})
    EXPECT_NE(eval.find(std::string(">") + k + "</text>"), std::string::npos) << k;
  // Three evaluated steps, joined: each series one path of an M and two L segments.
  EXPECT_EQ(count(eval, " L"), 3u * 2u);
}

// Speculative decoding's counters and the co-trained draft head's metrics: one summary row each
// (accepted / drafted and tokens per verify over the run; the head's loss and estimated
// acceptance, first step → last).
TEST_F(ReportTest, SummaryShowsSpeculationAndTheDraftHead) {
  std::string lines;
  for (int s = 1; s <= 4; ++s) {
    json j = step_line(s);
    j["spec_verifies"] = 10;
    j["spec_draft_tokens"] = 40;
    j["spec_accepted_tokens"] = 20;
    j["spec_emitted_tokens"] = 30;
    j["draft_loss"] = 5.0 - s;
    j["draft_accept"] = 0.1 * s;
    j["draft_accept_2"] = 0.05 * s;
    lines += j.dump() + "\n";
  }
  write("metrics.jsonl", lines);
  write("config.yaml", kConfig);
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string page = read(dir_ / "report.html");
  EXPECT_NE(page.find("speculative decoding: accepted / drafted, tokens per verify"),
            std::string::npos);
  EXPECT_NE(page.find("0.5, 3"), std::string::npos);
  const size_t row = page.find("draft head: loss, estimated acceptance at temperature 1");
  ASSERT_NE(row, std::string::npos);
  EXPECT_NE(page.find("4 → 1, 0.1 → 0.4", row), std::string::npos) << page.substr(row, 300);
  // Trained on its own drafts (rollout.speculative_draft_ttt_length): a row per further pass.
  const size_t ahead = page.find("draft head: estimated acceptance 2 tokens ahead");
  ASSERT_NE(ahead, std::string::npos);
  EXPECT_NE(page.find("0.05 → 0.2", ahead), std::string::npos) << page.substr(ahead, 300);
  EXPECT_EQ(page.find("3 tokens ahead"), std::string::npos);
}

// A live page (miles run rewrites it after its steps) reloads itself and says so; every step's
// sample dump is shown, escaped, the newest first and open.
TEST_F(ReportTest, LivePageReloadsAndShowsTheSamplesOfEachStep) {
  write_run(3);
  fs::create_directories(dir_ / "samples");
  write("samples/step_2.jsonl", json{{"prompt", "old"}, {"response", "old"}}.dump() + "\n");
  write("samples/step_3.jsonl",
        json{{"prompt", "Once <b>"}, {"response", "a dog."}, {"reward", 1.5}, {"advantage", 0.25}}
                .dump() +
            "\n");
  auto r = miles::report::write_report(dir_.string(), "", 15);
  ASSERT_TRUE(r.ok()) << r.message();
  const std::string page = read(dir_ / "report.html");
  EXPECT_NE(page.find("<meta http-equiv=\"refresh\" content=\"15\">"), std::string::npos);
  EXPECT_NE(page.find("reloads every 15 s"), std::string::npos);
  EXPECT_NE(page.find("<details open id=\"samples-step-3\">"), std::string::npos);
  EXPECT_NE(page.find("samples trained at step 3"), std::string::npos);
  EXPECT_NE(page.find("<td>Once &lt;b&gt;</td><td>a dog.</td><td>1.5</td><td>0.25</td>"),
            std::string::npos);
  // Earlier steps too, folded, after the newest.
  const size_t old_step = page.find("<details id=\"samples-step-2\">");
  ASSERT_NE(old_step, std::string::npos);
  EXPECT_GT(old_step, page.find("samples-step-3"));
  EXPECT_NE(page.find("<td>old</td><td>old</td>", old_step), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "report.html.tmp"));
  r = miles::report::write_report(dir_.string(), "");  // the run ended: no reload
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(read(dir_ / "report.html").find("http-equiv"), std::string::npos);
}

TEST_F(ReportTest, OutOptionWritesThere) {
  write_run(3);
  const fs::path out = dir_ / "sub.html";
  const auto r = report(" --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir_ / "report.html"));
}

TEST_F(ReportTest, OneStepNullsAndMissingKeys) {
  json j = step_line(1);
  j["reward_std"] = nullptr;  // what nlohmann writes for NaN
  j["loss"] = nullptr;
  for (const char* k : {"staleness_mean", "staleness_max", "ppo_kl", "clipfrac"}) j.erase(k);
  write("metrics.jsonl", j.dump() + "\n");
  const auto r = report();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("1 step, 13 charts, 4 skipped"), std::string::npos) << r.out;
  const std::string page = read(dir_ / "report.html");
  EXPECT_NE(page.find("Skipped the staleness chart: metrics.jsonl has no values for "
                      "staleness_mean, staleness_max."),
            std::string::npos);
  EXPECT_NE(page.find("Skipped the loss chart"), std::string::npos);
  EXPECT_NE(page.find("No values in metrics.jsonl for reward_std."), std::string::npos);
  EXPECT_EQ(page.find("reward_std</text>"), std::string::npos);  // no band, no legend entry
  EXPECT_NE(page.find("Skipped the ppo_kl chart"), std::string::npos);
  EXPECT_NE(page.find("No config.yaml in the run directory."), std::string::npos);
  EXPECT_NE(page.find("<svg id=\"plot-reward\""), std::string::npos);
  const std::regex bad(R"(nan|inf)", std::regex::icase);
  for (const std::string& svg : svgs(page)) {
    EXPECT_FALSE(std::regex_search(svg, bad)) << svg.substr(0, 200);
    if (svg.find("plot-mismatch-hist") == std::string::npos) {  // one step: a dot, not no line
      EXPECT_NE(svg.find("<circle"), std::string::npos) << svg.substr(0, 200);
    }
  }
}

TEST_F(ReportTest, NullHolesBreakTheLineAndAreNoted) {
  std::string lines;
  for (int s = 1; s <= 6; ++s) {
    json j = step_line(s);
    if (s == 3) j["reward_mean"] = nullptr;
    lines += j.dump() + "\n";
  }
  write("metrics.jsonl", lines);
  ASSERT_EQ(report().exit_code, 0);
  const std::string page = read(dir_ / "report.html");
  EXPECT_NE(page.find("No value (null or missing): reward_mean at 1 of 6 steps"),
            std::string::npos);
  const std::string reward = svgs(page)[0];
  const size_t d = reward.find("<path class=\"series\" d=\"");
  ASSERT_NE(d, std::string::npos);
  const std::string path = reward.substr(d, reward.find('"', d + 24) - d);
  EXPECT_EQ(count(path, "M"), 2u) << path;  // steps 1-2, then 4-6
}

TEST_F(ReportTest, Errors) {
  const auto missing_dir = miles::test::run_miles("report " + (dir_ / "nope").string());
  EXPECT_EQ(missing_dir.exit_code, 1);
  EXPECT_NE(missing_dir.out.find("not a directory"), std::string::npos) << missing_dir.out;

  const auto missing = report();
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("metrics.jsonl: not found"), std::string::npos) << missing.out;

  write("metrics.jsonl", "");
  const auto empty = report();
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.out.find("metrics.jsonl: empty, no steps recorded"), std::string::npos)
      << empty.out;

  write("metrics.jsonl",
        step_line(1).dump() + "\n" + step_line(2).dump() + "\n{\"step\": 3, \"loss\n");
  const auto malformed = report();
  EXPECT_EQ(malformed.exit_code, 1);
  EXPECT_NE(malformed.out.find("metrics.jsonl:3: malformed JSON (column "), std::string::npos)
      << malformed.out;

  // A number beyond a double is nlohmann's out_of_range, not a parse_error: an error, no crash.
  write("metrics.jsonl", step_line(1).dump() + "\n{\"step\": 2, \"loss\": 1e999}\n");
  const auto overflow = report();
  EXPECT_EQ(overflow.exit_code, 1);
  EXPECT_NE(overflow.out.find("metrics.jsonl:2: malformed JSON ("), std::string::npos)
      << overflow.out;
  EXPECT_NE(overflow.out.find("number overflow"), std::string::npos) << overflow.out;

  write("metrics.jsonl", step_line(1).dump() + "\n\n[1, 2]\n");
  const auto array = report();
  EXPECT_EQ(array.exit_code, 1);
  EXPECT_NE(array.out.find("metrics.jsonl:3: expected a JSON object, got array"), std::string::npos)
      << array.out;
  EXPECT_FALSE(fs::exists(dir_ / "report.html"));
}

// `miles report A B`: one page, one line per run on each chart over the union of their steps; a
// metric one run lacks is drawn for the other with a note; each run's row in the table.
TEST_F(ReportTest, SeveralRunsOverlaidOnOnePage) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  std::string a, b;
  for (int s = 1; s <= 10; ++s) a += step_line(s).dump() + "\n";
  for (int s = 1; s <= 5; ++s) {
    json j = step_line(s);
    j["reward_mean"] = 0.1 * s;
    j.erase("loss");
    b += j.dump() + "\n";
  }
  write("a/metrics.jsonl", a);
  write("b/metrics.jsonl", b);
  const std::string out = (dir_ / "cmp.html").string();
  const auto r = miles::test::run_miles("report " + (dir_ / "a").string() + " " +
                                        (dir_ / "b").string() + "/ --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("10 steps, 9 charts, 3 skipped"), std::string::npos) << r.out;
  const std::string page = read(out);
  const std::string name_a = html_escape_for_test((dir_ / "a").string());
  const std::string name_b = html_escape_for_test((dir_ / "b").string());
  const std::vector<std::string> charts = svgs(page);
  ASSERT_EQ(charts.size(), 9u);  // no eval or throughput in these lines
  for (const std::string& svg : charts) {
    EXPECT_EQ(svg.find("NaN"), std::string::npos);
    EXPECT_NE(svg.find(">" + name_a + "</text>"), std::string::npos) << svg.substr(0, 80);
    if (svg.find("plot-cmp-loss") == std::string::npos) {
      EXPECT_NE(svg.find(">" + name_b + "</text>"), std::string::npos) << svg.substr(0, 80);
    }
  }
  EXPECT_EQ(count(page, "<svg id=\"plot-cmp-reward_mean\""), 1u);
  EXPECT_NE(page.find("1 of 2 runs have no loss."), std::string::npos);
  EXPECT_NE(page.find("Skipped Evaluation reward (held-out prompts): no run has values for "
                      "eval_reward_mean."),
            std::string::npos);
  // Run b: 5 steps, reward 0.1 at its first step (a fifth of 5), 0.5 at its last.
  EXPECT_NE(page.find("<code>" + name_b + "</code></td><td>5</td><td>0.1</td><td>0.5</td>"),
            std::string::npos);
  for (const char* tag : {"<script", "<link", "<img", "<iframe"})
    EXPECT_EQ(page.find(tag), std::string::npos) << tag;

  const auto twice = miles::test::run_miles("report " + (dir_ / "a").string() + " " +
                                            (dir_ / "a").string() + " --out " + out);
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_NE(twice.out.find("given twice"), std::string::npos) << twice.out;
  const auto missing = miles::test::run_miles("report " + (dir_ / "a").string() + " " +
                                              (dir_ / "nope").string() + " --out " + out);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.out.find("nope/metrics.jsonl: not found"), std::string::npos) << missing.out;
}

TEST(ReportUnits, ParseCounterAndEscape) {
  auto t = miles::report::parse_metrics_jsonl(
      "{\"step\": 5, \"a\": 1, \"b\": null}\n\n{\"step\": 6, \"a\": 2, \"c\": true}\n", "m");
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->rows(), 2u);
  EXPECT_EQ(t->step, (std::vector<double>{5, 6}));
  EXPECT_EQ(t->column("a"), (std::vector<double>{1, 2}));
  EXPECT_FALSE(t->has("b"));
  EXPECT_TRUE(std::isnan(t->column("c")[0]));
  EXPECT_EQ(t->column("c")[1], 1.0);
  EXPECT_EQ(miles::report::counter_total({0, 1, 1, 3, NAN, 0, 2}), 5.0);  // reset after 3
  EXPECT_EQ(miles::report::html_escape("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  EXPECT_EQ(miles::report::format_number(NAN), "n/a");
  EXPECT_FALSE(miles::report::parse_metrics_jsonl("\n  \n", "m").ok());
}

// ---- headless Chromium -----------------------------------------------------------------------

std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  std::string d;
  while (std::getline(dirs, d, ':')) {
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
      const fs::path p = fs::path(d) / name;
      if (!d.empty() && ::access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return "";
}

// Pids whose command line mentions `marker` (our --user-data-dir).
std::vector<int> processes_with(const std::string& marker) {
  std::vector<int> pids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmd.find(marker) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

struct Rendered {
  int rc;
  std::string dom, log;
};

// chromium --headless --dump-dom with console messages on stderr, under `timeout`, with a fresh
// profile; then checks that none of its processes outlived it.
Rendered render(const std::string& chromium, const fs::path& dir, const fs::path& page) {
  const fs::path profile = dir / ("chromium-profile-" + page.stem().string());
  const fs::path dom = dir / (page.stem().string() + ".dom"),
                 log = dir / (page.stem().string() + ".log");
  const std::string cmd = "timeout -k 5 25 " + chromium +
                          " --headless --disable-gpu --no-sandbox --disable-dev-shm-usage"
                          " --no-first-run --disable-extensions --user-data-dir=" +
                          profile.string() + " --enable-logging=stderr --v=0 --dump-dom file://" +
                          page.string() + " >" + dom.string() + " 2>" + log.string() +
                          " </dev/null";
  const int status = std::system(cmd.c_str());
  Rendered r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", ""};
  std::ifstream d(dom), l(log);
  std::ostringstream ds, ls;
  ds << d.rdbuf();
  ls << l.rdbuf();
  r.dom = ds.str();
  r.log = ls.str();
  std::vector<int> left;
  for (int i = 0; i < 30; ++i) {  // helpers may take a moment to exit after the browser
    left = processes_with(profile.string());
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " chromium processes outlived the browser";
  for (int pid : left) ::kill(pid, SIGKILL);  // ours: they carry our profile directory
  return r;
}

std::string console_lines(const std::string& log) {
  std::string out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos)
      out += line + "\n";
  return out;
}

TEST_F(ReportTest, HeadlessChromiumRendersWithoutConsoleErrors) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "chromium not found on PATH (scripts/setup.sh installs Debian's chromium)";
  const auto t0 = std::chrono::steady_clock::now();

  // Control: this Chromium reports script errors and bad SVG attributes on stderr, as we expect.
  write("control.html",
        "<!DOCTYPE html><html><body><svg id=\"c\" width=\"9\" height=\"9\"><path d=\"M 1 NaN\"/>"
        "</svg><script>throw new Error(\"miles-probe\")</script></body></html>");
  const Rendered control = render(chromium, dir_, dir_ / "control.html");
  ASSERT_EQ(control.rc, 0) << control.log;
  EXPECT_NE(control.dom.find("<svg id=\"c\""), std::string::npos) << control.dom;
  EXPECT_NE(control.log.find("Uncaught Error: miles-probe"), std::string::npos) << control.log;
  EXPECT_NE(control.log.find("<path> attribute d"), std::string::npos) << control.log;

  write_run(10);
  ASSERT_EQ(report().exit_code, 0);
  const Rendered page = render(chromium, dir_, dir_ / "report.html");
  ASSERT_EQ(page.rc, 0) << page.log;
  for (const std::string& id : kCharts)
    EXPECT_NE(page.dom.find("<svg id=\"plot-" + id + "\""), std::string::npos) << id;
  EXPECT_NE(page.dom.find("<details id=\"config\">"), std::string::npos);
  EXPECT_NE(page.dom.find("<polygon class=\"band\""), std::string::npos);
  EXPECT_EQ(console_lines(page.log), "");

  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0);
  std::printf("headless chromium: control and report rendered in %.1f s\n", s);
}

}  // namespace
