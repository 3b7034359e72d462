// The `miles` program as a user runs it: generate reproduces llama2.c's reference text for
// stories260K, score prints HF-matching logprobs and experts as JSON, bad input exits 1 with a
// message, and `bench train` runs a step (or steps paced by a driver on stdin).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli_run.h"
#include "miles/checkpoint.h"
#include "miles/kernels.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::CliRun;
using test::miles_binary;
using test::run_miles;

// ../shared/README.md: llama2.c's run.c, `-t 0 -n 60 -i "Once upon a time"`.
constexpr const char* kReference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high\n";

TEST(Cli, GenerateGreedyStories260KReproducesLlama2cBothFormats) {
  MILES_REQUIRE_SHARED();
  const std::string dir = test::shared_dir() + "/models/stories260K/";
  // -n 60 in run.c = 60 positions; the prompt holds 5 (BOS included), so 56 new tokens.
  CliRun a = run_miles("generate --model " + dir +
                           "stories260K.bin --prompt 'Once upon a time' "
                           "--temperature 0 --max-new-tokens 56",
                       false);
  EXPECT_EQ(a.exit_code, 0);
  EXPECT_EQ(a.out, kReference);
  CliRun b =
      run_miles("generate --model " + dir + "checkpoint_v1.bin --tokenizer " + dir +
                    "tok512.bin --prompt 'Once upon a time' --temperature 0 --max-new-tokens 56",
                false);
  EXPECT_EQ(b.exit_code, 0);
  EXPECT_EQ(b.out, kReference);
}

TEST(Cli, GenerateSamplingIsSeeded) {
  MILES_REQUIRE_SHARED();
  const std::string m = test::shared_dir() + "/models/stories260K/stories260K.bin";
  const std::string args =
      "generate --model " + m + " --prompt 'Once upon a time' --max-new-tokens 40 ";
  CliRun a = run_miles(args + "--seed 5", false),
         b = run_miles(args + "--seed 5 --threads 1", false);
  CliRun c = run_miles(args + "--seed 6", false);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, ScoreMatchesHfGoldensAndPrintsExperts) {
  auto golden = read_safetensors(test::data_dir() + "/goldens/qwen3_moe.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.message();
  const Tensor* ids = golden->find("seq3.ids");
  const std::vector<float> logits = golden->find("seq3.logits")->to_f32();
  const Tensor* experts = golden->find("seq3.experts");
  std::string id_text;
  for (int64_t i = 0; i < ids->numel(); ++i)
    id_text += std::to_string(ids->data<int32_t>()[i]) + " ";
  CliRun r = run_miles(
      "score --model " + test::data_dir() + "/models/qwen3_moe --input-ids '" + id_text + "'",
      false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const int64_t t = ids->numel(), v = 1024;
  ASSERT_EQ(j["logprobs"].size(), static_cast<size_t>(t - 1));
  std::vector<float> lp(v);
  for (int64_t i = 0; i + 1 < t; ++i) {
    kernels::log_softmax_row(logits.data() + i * v, v, lp.data());
    EXPECT_NEAR(j["logprobs"][i].get<double>(), lp[ids->data<int32_t>()[i + 1]], 1e-4);
  }
  ASSERT_EQ(j["experts"].size(), static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t k = 0; k < 2; ++k)
        EXPECT_EQ(j["experts"][i][l][k].get<int>(), experts->data<int32_t>()[(i * 2 + l) * 2 + k]);
}

TEST(Cli, BadInputExitsOneWithAMessage) {
  CliRun a = run_miles("score --model /no/such/model --input-ids '1 2'");
  EXPECT_EQ(a.exit_code, 1);
  EXPECT_NE(a.out.find("/no/such/model"), std::string::npos) << a.out;
  CliRun b = run_miles("score --model " + test::data_dir() + "/models/llama --input-ids '1 x 2'");
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_NE(b.out.find("'x'"), std::string::npos) << b.out;
  CliRun c = run_miles("score --model " + test::data_dir() + "/models/llama --input-ids '1 99999'");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_NE(c.out.find("99999"), std::string::npos) << c.out;
  CliRun d =
      run_miles("generate --model " + test::data_dir() + "/models/llama --prompt hi --top-p 2");
  EXPECT_EQ(d.exit_code, 1);
  EXPECT_NE(d.out.find("top_p"), std::string::npos) << d.out;
}

// The kernels' environment switches take their documented values only: a misspelt one stops the
// program with a message naming it (a benchmark must not run the hardware's best ISA while
// reporting another), and an ISA above the hardware's runs the hardware's with a warning.
TEST(Cli, KernelEnvironmentSwitchesRefuseUnknownValues) {
  const std::string score =
      "score --model " + test::data_dir() + "/models/llama --input-ids '1 2 3'";
  for (const char* isa : {"scalar", "avx2"}) {
    if (std::string(isa) == "avx2" &&
        static_cast<int>(kernels::detect_isa()) < static_cast<int>(kernels::Isa::kAvx2))
      continue;
    CliRun ok = test::run_shell(std::string("MILES_ISA=") + isa + " " + miles_binary() + " " +
                                score + " 2>&1");
    EXPECT_EQ(ok.exit_code, 0) << isa << ": " << ok.out;
    EXPECT_EQ(ok.out.find("MILES_ISA"), std::string::npos) << ok.out;
  }
  for (const char* bad : {"avx3", "AVX2", "native", ""}) {
    CliRun r = test::run_shell(std::string("MILES_ISA='") + bad + "' " + miles_binary() + " " +
                               score + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(
        r.out.find("MILES_ISA must be scalar, avx2 or avx512, got '" + std::string(bad) + "'"),
        std::string::npos)
        << r.out;
  }
  CliRun hp = test::run_shell("MILES_HUGE_PAGES=yes " + miles_binary() + " " + score + " 2>&1");
  EXPECT_NE(hp.exit_code, 0);
  EXPECT_NE(hp.out.find("MILES_HUGE_PAGES must be 0 or 1, got 'yes'"), std::string::npos) << hp.out;
  if (kernels::detect_isa() != kernels::Isa::kAvx512) {
    CliRun up = test::run_shell("MILES_ISA=avx512 " + miles_binary() + " " + score + " 2>&1");
    EXPECT_EQ(up.exit_code, 0) << up.out;
    EXPECT_NE(up.out.find("MILES_ISA=avx512 but this CPU supports up to"), std::string::npos)
        << up.out;
  }
}

TEST(Cli, VersionAndLogLevel) {
  CliRun v = run_miles("--version", /*with_stderr=*/false);
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_EQ(v.out.rfind("miles 0.", 0), 0u) << v.out;
  EXPECT_NE(v.out.find("(commit "), std::string::npos) << v.out;
  // Log lines carry a timestamp and a level; --log-level warn hides the info line of generate.
  MILES_REQUIRE_SHARED();
  const std::string gen = "generate --model " + test::shared_dir() +
                          "/models/stories260K/stories260K.bin --prompt Once --temperature 0 "
                          "--max-new-tokens 2";
  CliRun info = run_miles(gen);
  EXPECT_EQ(info.exit_code, 0) << info.out;
  EXPECT_NE(info.out.find(" info miles generate: "), std::string::npos) << info.out;
  CliRun quiet = run_miles("--log-level warn " + gen);
  EXPECT_EQ(quiet.exit_code, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("miles generate: "), std::string::npos) << quiet.out;
  CliRun bad = run_miles("--log-level loud " + gen);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find("trace, debug, info"), std::string::npos) << bad.out;
}

TEST(Cli, BenchTrainRunsAStepAndReportsTokensPerSecond) {
  MILES_REQUIRE_SHARED();
  const std::string m = test::shared_dir() + "/models/stories260K/stories260K.bin";
  CliRun r =
      run_miles("bench train --model " + m +
                " --steps 1 --warmup 0 --batch 1 --seq-len 16 --threads 1 --peak-seconds 0.05");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
}

// --paced: one line from stdin before the peak and before each step (no breakdown here), a
// "paced: step" line after each; a driver that stops sending ends the run with an error.
TEST(Cli, BenchTrainPacedWaitsForTheDriverBeforeEachStep) {
  MILES_REQUIRE_SHARED();
  const std::string m = test::shared_dir() + "/models/stories260K/stories260K.bin";
  const std::string args = " bench train --model " + m +
                           " --steps 2 --warmup 1 --batch 1 --seq-len 16 --threads 1"
                           " --peak-seconds 0.05 --no-breakdown --paced 2>&1";
  CliRun ok = test::run_shell("printf 'p\\n1\\n2\\n3\\n' | " + miles_binary() + args);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  size_t waits = 0, steps = 0;
  for (size_t at = 0; (at = ok.out.find("paced: waiting", at)) != std::string::npos; ++at) ++waits;
  for (size_t at = 0; (at = ok.out.find("paced: step ", at)) != std::string::npos; ++at) ++steps;
  EXPECT_EQ(waits, 4u) << ok.out;
  EXPECT_EQ(steps, 3u) << ok.out;
  EXPECT_NE(ok.out.find("paced: step 0 "), std::string::npos) << ok.out;  // the warm-up step
  EXPECT_NE(ok.out.find("paced: step 2 "), std::string::npos) << ok.out;

  CliRun cut = test::run_shell("printf 'p\\n1\\n' | " + miles_binary() + args);
  EXPECT_EQ(cut.exit_code, 1) << cut.out;
  EXPECT_NE(cut.out.find("--paced: stdin closed"), std::string::npos) << cut.out;
  EXPECT_EQ(cut.out.find("paced: step 2 "), std::string::npos) << cut.out;
}

TEST(Cli, BenchSyncMeasuresEveryTransportBetweenProcesses) {
  MILES_REQUIRE_SHARED();
  const std::string m = test::shared_dir() + "/models/stories260K/stories260K.bin";
  CliRun r = run_miles("bench sync --model " + m + " --repeats 1 --engines 2");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* t :
       {"| broadcast |", "| p2p |", "| disk-delta, compression small, encoding difference |",
        "| disk-delta, compression fast, encoding difference |",
        "| disk-delta, compression small, encoding xor |", "memcpy", "of full", "MB of weights",
        "receive(v2)"})
    EXPECT_NE(r.out.find(t), std::string::npos) << t << " missing in:\n" << r.out;
  // Tensor-parallel engines: each rank's shard straight from the sender, and via rank 0.
  r = run_miles("bench sync --model " + m +
                " --repeats 1 --engines 1 --engine-tp 2 --transport p2p,p2p-hop");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* t : {"| p2p |", "| p2p-hop |", "| 1 x 2 |"})
    EXPECT_NE(r.out.find(t), std::string::npos) << t << " missing in:\n" << r.out;
}

// `bench kernels` at its shortest: every table prints, and the training GEMMs' table is consistent
// with itself: each % of the run's peak is the row's FLOPs over its printed time and the printed
// peak, the step's time and FLOPs are the rows' sums, and each % of the peak beside a GEMM is a
// positive number. (The figures themselves are timings: with one call each, on two cores shared
// with other tests, a loop preempted once moves a ratio by several times, so no range is asked.)
TEST(Cli, BenchKernelsPrintsEveryTableAgainstItsPeaks) {
  MILES_REQUIRE_SHARED();
  const std::string m = test::shared_dir() + "/models/stories260K/stories260K.bin";
  const CliRun r = run_miles("bench kernels --threads 2 --min-seconds 0.001 --model " + m);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* t : {"FMA peak measured", "training GEMMs", "decode GEMMs from memory",
                        "a plain read of the same bytes", "decode batch 32"})
    EXPECT_NE(r.out.find(t), std::string::npos) << t << " missing in:\n" << r.out;
  std::smatch head;
  ASSERT_TRUE(std::regex_search(r.out, head,
                                std::regex(R"(training GEMMs, (\d+) tokens, 2 threads \(% of )"
                                           R"(([\d.]+) GFLOP/s\))")))
      << r.out;
  const double tokens = std::stod(head[1].str()), peak = std::stod(head[2].str());
  ASSERT_GT(peak, 0) << head[0].str();
  // matrix N K, three % of the run's peak, three times in ms, three % of the peak beside each.
  const std::regex row(
      R"((q/k/v|o|gate/up|down|lm head) +(\d+) +(\d+) +([\d.]+)% +([\d.]+)% +([\d.]+)% +)"
      R"(([\d.]+) / ([\d.]+) / ([\d.]+) +([\d.]+) / ([\d.]+) / ([\d.]+))");
  int rows = 0;
  double step_s = 0, step_flops = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row);
       it != std::sregex_iterator(); ++it, ++rows) {
    const std::smatch& g = *it;
    const double flops = 2.0 * tokens * std::stod(g[2].str()) * std::stod(g[3].str());
    const double per_step = g[1].str() == "lm head" ? 1 : 30;  // layers with the matrix
    for (int c = 0; c < 3; ++c) {
      const double ms = std::stod(g[7 + c].str());
      ASSERT_GT(ms, 0) << g[0].str();
      const double pct = 100.0 * flops / (ms * 1e-3) / 1e9 / peak;
      // Printed to 0.1 %, from a time printed to 1 us and a peak printed to 0.1 GFLOP/s.
      EXPECT_NEAR(std::stod(g[4 + c].str()), pct, 0.06 + pct * (5e-4 / ms + 0.05 / peak))
          << g[0].str();
      EXPECT_GT(std::stod(g[10 + c].str()), 0) << g[0].str();
      step_s += 4 * per_step * ms * 1e-3;
      step_flops += 4 * per_step * flops;
    }
  }
  EXPECT_EQ(rows, 5) << r.out;
  std::smatch step;
  ASSERT_TRUE(std::regex_search(
      r.out, step,
      std::regex(R"(a step's GEMMs \(4 micro-batches\): ([\d.]+) s, ([\d.]+)% of the peak )"
                 R"(\(([\d.]+) s at the peak\); ([\d.]+)% of the peak beside each GEMM )"
                 R"(\(([\d.]+) s at it\))")))
      << r.out;
  const double printed_s = std::stod(step[1].str());
  EXPECT_NEAR(printed_s, step_s, 0.0005 + step_s * 1e-3) << step[0].str();
  EXPECT_NEAR(std::stod(step[3].str()), step_flops / 1e9 / peak, 0.0005 + step_s * 1e-3)
      << step[0].str();
  EXPECT_NEAR(std::stod(step[2].str()), 100.0 * std::stod(step[3].str()) / printed_s, 0.1)
      << step[0].str();
  EXPECT_GT(std::stod(step[5].str()), 0) << step[0].str();
  EXPECT_NEAR(std::stod(step[4].str()), 100.0 * std::stod(step[5].str()) / printed_s, 0.1)
      << step[0].str();
}

}  // namespace
}  // namespace miles
