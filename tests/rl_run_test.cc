// `miles run` end to end, with real engine processes: the CI quickstart learns and its trainer and
// engine logprobs agree exactly; a resumed run continues bit for bit; an engine killed mid-run is
// restarted, brought to the current weights, and the run's numbers do not change (no sample lost
// or duplicated); the broadcast transport gives the disk-delta run, also through a killed engine;
// one-step-off samples are exactly one version stale; async runs keep the staleness bound through
// partial rollouts; engines can register themselves; bad configs fail with the line.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli_run.h"
#include "miles/device_model.h"
#include "miles/v1/controller.grpc.pb.h"
#include "scratch_dir.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string temp_dir(const std::string& name) {
  const std::string d = test::scratch_dir("miles_rl_", name);  // removed when the test exits
  fs::create_directories(d);
  return d;
}

// `miles run ARGS` from the source directory (configs use paths relative to it).
test::CliRun run(const std::string& args) { return test::run_miles("run " + args); }
std::string cd_source() { return "cd '" + test::source_dir() + "' && "; }
test::CliRun run_here(const std::string& args) { return test::run_miles_in_source("run " + args); }

// One JSON value per line of a file (none when it is missing).
std::vector<json> jsonl(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

std::vector<json> metrics(const std::string& run_dir) { return jsonl(run_dir + "/metrics.jsonl"); }

// The `rewards=[…]` override of a command reward named `name` running the shell script `body`
// (written to DIR/NAME.sh): one JSON score line per sample line.
std::string command_reward(const std::string& dir, const std::string& name,
                           const std::string& body) {
  const std::string script = dir + "/" + name + ".sh";
  std::ofstream(script) << body;
  return " 'rewards=[{kind: command, command: \"sh " + script + "\", name: " + name + "}]'";
}

// A command reward "dog": 1 for a response that mentions a dog, else 0.
std::string dog_command_reward(const std::string& dir) {
  return command_reward(dir, "dog",
                        "while read -r line; do\n"
                        "  if printf '%s' \"$line\" | grep -q '\"response\":\"[^\"]*dog'; then\n"
                        "    echo '{\"score\": 1}'\n"
                        "  else\n"
                        "    echo '{\"score\": 0}'\n"
                        "  fi\n"
                        "done\n");
}

// The fields that depend only on the data, the seeds and the arithmetic (not on timing).
json numbers(const json& m) {
  json out;
  for (const char* k :
       {"step", "weight_version", "samples", "reward_mean", "reward_std", "response_length_mean",
        "loss", "grad_norm", "lr", "ppo_kl", "clipfrac", "logp_abs_diff_max", "staleness_max"})
    out[k] = m.at(k);
  return out;
}

double mean_reward(const std::vector<json>& m, size_t first, size_t count) {
  double s = 0;
  for (size_t i = first; i < first + count; ++i) s += m[i]["reward_mean"].get<double>();
  return s / count;
}

const char* kCi = "configs/quickstart_ci.yaml";

TEST(RlRun, QuickstartCiRewardRisesAndLogprobsAgreeExactly) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("ci");
  auto r = run_here(std::string(kCi) + " --run-dir " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = metrics(dir);
  ASSERT_EQ(m.size(), 8u);
  for (const json& s : m) {
    EXPECT_EQ(s["samples"], 32);
    EXPECT_EQ(s["logp_abs_diff_max"], 0.0) << s.dump();  // true on-policy: same bits
    EXPECT_EQ(s["ppo_kl"], 0.0);
    EXPECT_EQ(s["clipfrac"], 0.0);
    EXPECT_EQ(s["staleness_max"], 0.0);
    EXPECT_EQ(s["reward_errors"], 0.0);
  }
  const double first = mean_reward(m, 0, 3), last = mean_reward(m, 5, 3);
  EXPECT_GT(last, first + 0.3) << "reward did not rise: " << first << " -> " << last;
  EXPECT_NE(r.out.find("reward mean of the first 4 steps"), std::string::npos)
      << r.out;  // 8 steps: two disjoint windows of 4
  EXPECT_TRUE(fs::exists(dir + "/config.yaml"));
  // The report the run kept up to date: final (no reload), with the last step's samples.
  std::ifstream page(dir + "/report.html");
  ASSERT_TRUE(page) << "no report.html";
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_EQ(html.find("http-equiv=\"refresh\""), std::string::npos);
  EXPECT_NE(html.find("samples trained at step 8"), std::string::npos);
}

TEST(RlRun, ResumedRunContinuesBitForBit) {
  MILES_REQUIRE_SHARED();
  const std::string a = temp_dir("straight"), b = temp_dir("resumed");
  auto ra = run_here(std::string(kCi) + " --run-dir " + a + " rollout.num_rollouts=4");
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  // The resumed run keeps one weight version loadable on disk, each of them full.
  const std::string pruned = " weight_sync.full_every=1 weight_sync.keep_versions=1";
  auto rb = run_here(std::string(kCi) + " --run-dir " + b +
                     " rollout.num_rollouts=2 checkpoint.save_every=2" + pruned);
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  ASSERT_TRUE(fs::exists(b + "/checkpoints/step_00000002/trainer_state.json"));
  const auto versions = [](const std::string& run_dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(run_dir + "/weights"))
      if (e.path().filename().string().starts_with("weight_v"))
        names.insert(e.path().filename().string());
    return names;
  };
  // Pruning runs before each publish: version 0 went as version 2 was published.
  EXPECT_EQ(versions(b), (std::set<std::string>{"weight_v000001", "weight_v000002"}));
  auto rc = run_here(std::string(kCi) + " --run-dir " + b +
                     " rollout.num_rollouts=4 checkpoint.save_every=2 --resume" + pruned);
  ASSERT_EQ(rc.exit_code, 0) << rc.out;
  EXPECT_NE(rc.out.find("resumed from"), std::string::npos) << rc.out;
  // The resumed run adopted the checkpoint's version 2 (version 1 went then); 2 went with 4.
  EXPECT_EQ(versions(b), (std::set<std::string>{"weight_v000003", "weight_v000004"}));
  // The default (keep 4, a full version every 10) removes nothing in a short run.
  EXPECT_EQ(versions(a).size(), 5u);
  auto ma = metrics(a), mb = metrics(b);
  ASSERT_EQ(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(numbers(ma[i]), numbers(mb[i])) << "step " << i + 1;
}

// The controller's GetStatus over gRPC (its address is in RUN_DIR/controller.json).
bool engine_pids(const std::string& run_dir, std::vector<int64_t>* pids) {
  std::ifstream in(run_dir + "/controller.json");
  if (!in) return false;
  json c = json::parse(in, nullptr, false);
  if (c.is_discarded()) return false;
  auto stub = v1::Controller::NewStub(
      grpc::CreateChannel(c["address"].get<std::string>(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // The controller answers only with the run's token (the test gave the run its token).
  if (const char* t = std::getenv("MILES_RUN_TOKEN"))
    ctx.AddMetadata("authorization", std::string("Bearer ") + t);
  v1::ControllerStatus st;
  if (!stub->GetStatus(&ctx, v1::ControllerStatusRequest(), &st).ok()) return false;
  pids->clear();
  for (const auto& e : st.engines())
    if (e.state() == "ready" && e.pid() > 0 && e.in_flight() > 0) pids->push_back(e.pid());
  return !pids->empty();
}

// `miles run` with two engines (and `extra` overrides) into `dir`, one of them killed (SIGKILL)
// after step 2 while it has groups in flight. The engine is frozen (SIGSTOP) first and killed only
// if, 50 ms later, the controller still waits for it: a fast engine may otherwise have sent its
// last reply between the status read and the kill, and die with nothing to redispatch.
test::CliRun run_killing_an_engine(const std::string& dir, const std::string& extra) {
  ::setenv("MILES_RUN_TOKEN", "kill-test-token", 1);  // known to the killer's status calls
  std::thread killer([&] {
    for (int i = 0; i < 12000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (metrics(dir).size() < 2) continue;
      std::vector<int64_t> pids;
      if (!engine_pids(dir, &pids)) continue;
      const auto pid = static_cast<pid_t>(pids.front());
      kill(pid, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (engine_pids(dir, &pids) && std::find(pids.begin(), pids.end(), pid) != pids.end()) {
        kill(pid, SIGKILL);
        return;
      }
      kill(pid, SIGCONT);
    }
  });
  auto r = run_here(std::string(kCi) + " --run-dir " + dir +
                    " rollout.num_rollouts=6 rollout.num_engines=2 rollout.max_new_tokens=32"
                    " rollout.health_check_interval_s=0.2" +
                    extra);
  killer.join();
  ::unsetenv("MILES_RUN_TOKEN");
  return r;
}

// The killed run against a straight 6-step run: the engine was restarted, and the numbers match.
void expect_killed_run_unchanged(const test::CliRun& r, const std::string& dir,
                                 const std::string& ref) {
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("dead"), std::string::npos) << r.out;
  auto m = metrics(dir), mr = metrics(ref);
  ASSERT_EQ(m.size(), 6u);
  ASSERT_EQ(mr.size(), 6u);
  EXPECT_EQ(m.back()["engine_failures"].get<int64_t>(), 1) << m.back().dump();
  EXPECT_EQ(m.back()["engine_restarts"].get<int64_t>(), 1) << m.back().dump();
  EXPECT_GE(m.back()["groups_redispatched"].get<int64_t>(), 1) << m.back().dump();
  // Same samples, same training: the restarted engine served the current weights, no group was
  // lost or counted twice, and two engines give what one gave.
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << "step " << i + 1;
}

TEST(RlRun, KilledEngineIsRestartedWithCurrentWeightsAndNothingChanges) {
  MILES_REQUIRE_SHARED();
  const std::string ref = temp_dir("ref"), dir = temp_dir("kill");
  auto rr = run_here(std::string(kCi) + " --run-dir " + ref + " rollout.num_rollouts=6");
  ASSERT_EQ(rr.exit_code, 0) << rr.out;
  expect_killed_run_unchanged(run_killing_an_engine(dir, ""), dir, ref);
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// weight_sync.transport=broadcast: the controller sends every version to both engines over a Gloo
// group; they hold the trainer's exact bytes (|Δlogp| max exactly 0) and the run is the disk-delta
// run, number for number (both with two engines; the sync times are printed side by side).
TEST(RlRun, BroadcastTransportGivesTheDiskDeltaRun) {
  MILES_REQUIRE_SHARED();
  const std::string ref = temp_dir("bcast_ref"), dir = temp_dir("bcast");
  const std::string two = " rollout.num_rollouts=4 rollout.num_engines=2";
  auto rr = run_here(std::string(kCi) + " --run-dir " + ref + two);
  ASSERT_EQ(rr.exit_code, 0) << rr.out;
  auto mr = metrics(ref);
  ASSERT_EQ(mr.size(), 4u);
  // The engines are on this host: shared memory (weight_sync.comm auto), and over TCP when asked.
  for (const char* comm : {"auto", "gloo"}) {
    const std::string d = dir + "_" + comm;
    auto r = run_here(std::string(kCi) + " --run-dir " + d + two +
                      " weight_sync.transport=broadcast weight_sync.comm=" + comm);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("weight group wsync-1 formed: 2 engines"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string(comm) == "gloo" ? "over TCP (gloo)" : "over shared memory"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(count(r.out, "formed:"), 1u) << r.out;  // the same engines all run: one group
    EXPECT_EQ(r.out.find("over disk-delta"), std::string::npos) << r.out;  // no fallback
    // The disk copies, written in the background, are all there for late engines.
    EXPECT_TRUE(fs::is_directory(d + "/weights/weight_v000004")) << comm;
    auto m = metrics(d);
    ASSERT_EQ(m.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(m[i]["logp_abs_diff_max"], 0.0) << m[i].dump();
      EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << comm << " step " << i + 1;
      std::printf("step %zu: time_sync_s broadcast (%s) %.3f, disk-delta %.3f\n", i + 1, comm,
                  m[i]["time_sync_s"].get<double>(), mr[i]["time_sync_s"].get<double>());
    }
  }
}

// Runs the CI job for 3 rollouts plainly (`common` overrides) and with `variant` overrides: the two
// runs agree number for number, |Δlogp| exactly 0, and engine 0's log says `engine_says`. `out`:
// the variant run's output; `run_dir`: its directory.
void expect_same_run(const std::string& name, const std::string& common, const std::string& variant,
                     const std::string& engine_says, std::string* out = nullptr,
                     std::string* run_dir = nullptr) {
  const std::string ref = temp_dir(name + "_ref"), dir = temp_dir(name);
  if (run_dir) *run_dir = dir;
  ASSERT_EQ(run_here(std::string(kCi) + " --run-dir " + ref + common).exit_code, 0);
  auto r = run_here(std::string(kCi) + " --run-dir " + dir + common + variant);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  if (out) *out = r.out;
  std::ifstream log(dir + "/engines/engine_0.log");
  const std::string engine_log((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(engine_log.find(engine_says), std::string::npos) << engine_log;
  const auto m = metrics(dir), mr = metrics(ref);
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(mr.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m[i]["logp_abs_diff_max"], 0.0) << m[i].dump();
    EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << "step " << i + 1;
  }
}

// The CI job with `common` overrides, against the same with engines of two tensor-parallel
// processes each (`miles serve --tp 2`, rollout.engine_tp=2) whose every process is in the weight
// group and keeps its own shard: the runs agree number for number (stories260K splits over 2 on
// chunk boundaries, so every logit is the same bits), |Δlogp| exactly 0, the per-shard checksums
// checked after every version, one group formed and no engine brought over disk-delta instead.
// `comm`: the log's words for the group's communicator.
void expect_engine_tp_run(const std::string& name, const std::string& common,
                          const std::string& comm) {
  std::string out;
  expect_same_run(name, common, " rollout.engine_tp=2", "tensor parallel over 2 processes", &out);
  EXPECT_NE(
      out.find("straight to each engine's 2 tensor-parallel ranks (each keeps its shard), " + comm),
      std::string::npos)
      << out;
  EXPECT_EQ(out.find("over disk-delta"), std::string::npos) << out;  // no fallback
  EXPECT_EQ(count(out, "formed:"), 1u) << out;
}

// Broadcast: every engine process receives each bucket and keeps its slice (comm auto: the
// engines and their followers are on this host, so over shared memory).
TEST(RlRun, TensorParallelEnginesGiveTheSingleProcessEngineRun) {
  MILES_REQUIRE_SHARED();
  expect_engine_tp_run("engine_tp", " rollout.num_rollouts=3 weight_sync.transport=broadcast",
                       "over shared memory");
}

// p2p: a tp = 2 trainer's two ranks send every engine process only its own shard, with no second
// hop inside the engine (over Gloo here).
TEST(RlRun, P2pHandsEachTensorParallelEngineRankItsShard) {
  MILES_REQUIRE_SHARED();
  expect_engine_tp_run(
      "p2p_etp",
      " rollout.num_rollouts=3 parallel.tp=2 weight_sync.transport=p2p weight_sync.comm=gloo",
      "over TCP (gloo)");
}

// Engines and a trainer whose forwards (and backward) run the device kernels (here emulated on the
// host: the CUDA kernels' code), the engines' KV in device memory: the run equals the CPU run
// number for number, |Δlogp| = 0 between the device engine's sampling logprobs and the device
// trainer's.
TEST(RlRun, DeviceEnginesGiveTheCpuEngineRun) {
  MILES_REQUIRE_SHARED();
  expect_same_run("device", " rollout.num_rollouts=3",
                  " rollout.engine_device=emulated trainer.device=emulated",
                  "forwards on emulated");
}

// Engines that verify drafts (rollout.speculative, every proposal verified): the run equals the
// plain run number for number (rewards, lengths, loss, grad norm, |Δlogp| 0 at every step), and
// the engines did verify drafts (metrics.jsonl's per-step counters).
TEST(RlRun, SpeculativeEnginesGiveThePlainRun) {
  MILES_REQUIRE_SHARED();
  std::string dir;
  expect_same_run("spec", " rollout.num_rollouts=3",
                  " rollout.speculative=true rollout.speculative_adaptive=false",
                  "speculative decoding (model-free suffix drafter, up to 4 drafts per sample, "
                  "every proposal verified)",
                  nullptr, &dir);
  uint64_t drafted = 0, accepted = 0;
  for (const json& m : metrics(dir)) {
    drafted += m.at("spec_draft_tokens").get<uint64_t>();
    accepted += m.at("spec_accepted_tokens").get<uint64_t>();
  }
  EXPECT_GT(accepted, 0u);
  EXPECT_GE(drafted, accepted);
}

// The co-trained draft head (rollout.speculative_draft_head): the policy's run is the plain run
// number for number, the draft's loss and estimated acceptance are in metrics.jsonl every step and
// its loss falls, and a data-parallel (dp = 2) and a pipeline (pp = 2: the last stage trains it,
// stage 0 publishes it) trainer train the same draft bit for bit; a tensor-parallel one (tp = 2:
// the logits' vocabulary slices gathered whole) its first step bit for bit and the rest within the
// policy's tp drift.
TEST(RlRun, DraftHeadTrainsBesideThePolicyWithoutChangingIt) {
  MILES_REQUIRE_SHARED();
  const std::string common = " rollout.num_rollouts=3";
  const std::string draft =
      " rollout.speculative_draft_head=true rollout.speculative_draft_lr=0.003";
  const std::string ref = temp_dir("draft_ref"), dir = temp_dir("draft"), dp = temp_dir("draft_dp");
  ASSERT_EQ(run_here(std::string(kCi) + " --run-dir " + ref + common).exit_code, 0);
  auto r = run_here(std::string(kCi) + " --run-dir " + dir + common + draft);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto r2 = run_here(std::string(kCi) + " --run-dir " + dp + common + draft + " parallel.dp=2");
  ASSERT_EQ(r2.exit_code, 0) << r2.out;
  const std::string pp = temp_dir("draft_pp");
  auto r3 = run_here(std::string(kCi) + " --run-dir " + pp + common + draft + " parallel.pp=2");
  ASSERT_EQ(r3.exit_code, 0) << r3.out;
  const std::string tp = temp_dir("draft_tp");
  auto r4 = run_here(std::string(kCi) + " --run-dir " + tp + common + draft + " parallel.tp=2");
  ASSERT_EQ(r4.exit_code, 0) << r4.out;
  const auto m = metrics(dir), mr = metrics(ref), md = metrics(dp), mp = metrics(pp),
             mt = metrics(tp);
  ASSERT_EQ(mp.size(), 3u);
  ASSERT_EQ(mt.size(), 3u);
  // The heads published by the last step are the same bytes.
  std::ifstream a(dir + "/weights/draft/3.safetensors", std::ios::binary),
      b(pp + "/weights/draft/3.safetensors", std::ios::binary);
  const std::string ha((std::istreambuf_iterator<char>(a)), {}),
      hb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_FALSE(ha.empty());
  EXPECT_EQ(ha, hb) << "pp=2 published another head";
  std::ifstream c(dir + "/weights/draft/1.safetensors", std::ios::binary),
      d(tp + "/weights/draft/1.safetensors", std::ios::binary);
  const std::string hc((std::istreambuf_iterator<char>(c)), {}),
      hd((std::istreambuf_iterator<char>(d)), {});
  EXPECT_FALSE(hc.empty());
  EXPECT_EQ(hc, hd) << "tp=2 published another head after its first step";
  ASSERT_EQ(m.size(), 3u);
  ASSERT_EQ(mr.size(), 3u);
  ASSERT_EQ(md.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << "step " << i + 1;
    EXPECT_FALSE(mr[i].contains("draft_loss"));
    for (const char* k : {"draft_loss", "draft_agree", "draft_accept", "draft_in_vocab"}) {
      ASSERT_TRUE(m[i].contains(k)) << k << " " << m[i].dump();
      EXPECT_EQ(m[i][k], md[i][k]) << k << " step " << i + 1 << " (dp=2)";
      EXPECT_EQ(m[i][k], mp[i][k]) << k << " step " << i + 1 << " (pp=2)";
      // tp = 2: the policy's forward is bitwise, its gradients within 1e-6 (column-parallel input
      // gradients), so the head's first step is exact and later ones within that drift.
      const double a = m[i][k].get<double>(), t = mt[i][k].get<double>();
      if (i == 0)
        EXPECT_EQ(a, t) << k << " step 1 (tp=2)";
      else
        EXPECT_LE(std::fabs(a - t), 1e-5 * std::max(1.0, std::fabs(a)))
            << k << " step " << i + 1 << " (tp=2)";
    }
    const double accept = m[i]["draft_accept"].get<double>();
    EXPECT_GT(accept, 0.0);
    EXPECT_LE(accept, 1.0);
    EXPECT_GT(m[i]["draft_loss"].get<double>(), 0.0);
  }
  EXPECT_LT(m[2]["draft_loss"].get<double>(), m[0]["draft_loss"].get<double>());
}

// A head on the outputs of layers 0, 2 and 4 of stories260K's five (EAGLE-3's features). Under a
// pipeline those layers live on different stages, which send them straight to the last stage over
// the tap channel, outside the 1F1B schedule: pp = 2 (stage 0 holds layers 0 and 2; over shared
// memory) and pp = 3 (stage 0's layer 0 skips stage 1; over Gloo and over shared memory) train
// and publish the single process's head bit for bit; tp = 2's first step is the single process's.
// A device trainer (emulated) trains it on the host from the features and logits its device
// forward copies back: the CPU trainer's head, bit for bit.
TEST(RlRun, DraftHeadOnSeveralLayersTrainsAsOneProcessUnderPipelines) {
  MILES_REQUIRE_SHARED();
  const std::string job = std::string(kCi) +
                          " rollout.num_rollouts=3 rollout.speculative_draft_head=true"
                          " rollout.speculative_draft_lr=0.003"
                          " rollout.speculative_draft_layers=[0,2,4] --run-dir ";
  const std::string one = temp_dir("draft3_one");
  auto r = run_here(job + one);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto m = metrics(one);
  ASSERT_EQ(m.size(), 3u);
  const auto file = [](const std::string& dir, int v) {
    std::ifstream f(dir + "/weights/draft/" + std::to_string(v) + ".safetensors", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  const std::string head3 = file(one, 3);
  ASSERT_FALSE(head3.empty());
  EXPECT_NE(head3.find("draft.feature_fc.weight"), std::string::npos);
  EXPECT_NE(head3.find("draft.feature_layers"), std::string::npos);
  for (const std::string layout :
       {" parallel.pp=2", " parallel.pp=3 parallel.comm=gloo", " parallel.pp=3", " parallel.tp=2",
        " trainer.device=emulated"}) {
    const std::string dir = temp_dir("draft3_layout");
    auto rl = run_here(job + dir + layout);
    ASSERT_EQ(rl.exit_code, 0) << layout << rl.out;
    const auto ml = metrics(dir);
    ASSERT_EQ(ml.size(), 3u) << layout;
    const bool tp = layout == " parallel.tp=2";
    for (size_t i = 0; i < (tp ? 1u : 3u); ++i)
      for (const char* k : {"draft_loss", "draft_agree", "draft_accept", "draft_in_vocab"})
        EXPECT_EQ(m[i].at(k), ml[i].at(k)) << k << " step " << i + 1 << layout;
    EXPECT_TRUE(file(one, tp ? 1 : 3) == file(dir, tp ? 1 : 3))
        << layout << " published another head";
  }
  EXPECT_LT(m[2]["draft_loss"].get<double>(), m[0]["draft_loss"].get<double>());
}

// EAGLE-3's training-time test (rollout.speculative_draft_ttt_length = 3): the head also trains on
// its own drafts, passes 2 and 3 reported as draft_*_2 / draft_*_3; a two-stage pipeline trains
// and publishes the single process's head bit for bit, tensor parallelism its first step's, and
// the head differs from one trained on the policy's features alone.
TEST(RlRun, DraftHeadTrainedOnItsOwnDraftsTrainsAsOneProcessUnderAPipeline) {
  MILES_REQUIRE_SHARED();
  const std::string job = std::string(kCi) +
                          " rollout.num_rollouts=2 rollout.speculative_draft_head=true"
                          " rollout.speculative_draft_lr=0.003 --run-dir ";
  const std::string ttt = " rollout.speculative_draft_ttt_length=3";
  const std::string one = temp_dir("ttt_one"), pp = temp_dir("ttt_pp"), tp = temp_dir("ttt_tp"),
                    plain = temp_dir("ttt_no");
  for (const auto& [dir, extra] :
       {std::pair{one, ttt}, std::pair{pp, ttt + " parallel.pp=2"},
        std::pair{tp, ttt + " parallel.tp=2"}, std::pair{plain, std::string()}}) {
    auto r = run_here(job + dir + extra);
    ASSERT_EQ(r.exit_code, 0) << extra << r.out;
  }
  const auto m = metrics(one), mp = metrics(pp), mt = metrics(tp), mn = metrics(plain);
  ASSERT_EQ(m.size(), 2u);
  ASSERT_EQ(mp.size(), 2u);
  ASSERT_EQ(mt.size(), 2u);
  ASSERT_EQ(mn.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    for (const std::string k : {"draft_loss", "draft_accept", "draft_loss_2", "draft_accept_2",
                                "draft_agree_3", "draft_accept_3"}) {
      ASSERT_TRUE(m[i].contains(k)) << k << " " << m[i].dump();
      EXPECT_EQ(m[i][k], mp[i][k]) << k << " step " << i + 1 << " (pp=2)";
      // tp = 2: step 1 trains on the same samples (the policy's gradients then differ within the
      // trainer's tolerance, so step 2's samples may too).
      if (i == 0) EXPECT_EQ(m[i][k], mt[i][k]) << k << " step 1 (tp=2)";
    }
    EXPECT_FALSE(mn[i].contains("draft_loss_2"));
    const double a2 = m[i]["draft_accept_2"].get<double>();
    EXPECT_GT(a2, 0.0);
    EXPECT_LE(a2, 1.0);
  }
  // Step 1 trains from the same head on the same samples: pass 1's numbers are the plain run's.
  EXPECT_EQ(m[0]["draft_loss"], mn[0]["draft_loss"]);
  const auto file = [](const std::string& dir, int step) {
    std::ifstream f(dir + "/weights/draft/" + std::to_string(step) + ".safetensors",
                    std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  ASSERT_FALSE(file(one, 1).empty());
  ASSERT_FALSE(file(one, 2).empty());
  EXPECT_TRUE(file(one, 2) == file(pp, 2)) << "pp=2 published another head";
  EXPECT_TRUE(file(one, 1) == file(tp, 1)) << "tp=2 published another head after its first step";
  EXPECT_FALSE(file(one, 2) == file(plain, 2)) << "the passes on its own drafts changed nothing";
}

// The draft head is in the checkpoint (its tensors, AdamW moments and step count, the id counts
// that choose its vocabulary): a run saved and resumed under a two-stage pipeline (whose last stage
// trains the head) continues the straight single-process run, the head's metrics and its published
// file included.
void resume_draft_head(const std::string& layers) {
  const std::string draft =
      " rollout.speculative_draft_head=true rollout.speculative_draft_lr=0.003" + layers;
  const std::string a = temp_dir("draft_straight"), b = temp_dir("draft_resumed");
  auto ra = run_here(std::string(kCi) + " --run-dir " + a + " rollout.num_rollouts=4" + draft);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  const std::string part = std::string(kCi) + " --run-dir " + b + draft +
                           " checkpoint.save_every=2 parallel.pp=2 rollout.num_rollouts=";
  auto rb = run_here(part + "2");
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  ASSERT_TRUE(fs::exists(b + "/checkpoints/step_00000002/draft.safetensors"));
  auto rc = run_here(part + "4 --resume");
  ASSERT_EQ(rc.exit_code, 0) << rc.out;
  EXPECT_NE(rc.out.find("draft head resumed after its step 2"), std::string::npos) << rc.out;
  const auto ma = metrics(a), mb = metrics(b);
  ASSERT_EQ(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(numbers(ma[i]), numbers(mb[i])) << "step " << i + 1;
    for (const char* k : {"draft_loss", "draft_agree", "draft_accept", "draft_in_vocab"})
      EXPECT_EQ(ma[i].at(k), mb[i].at(k)) << k << " step " << i + 1;
  }
  std::ifstream fa(a + "/weights/draft/4.safetensors", std::ios::binary),
      fb(b + "/weights/draft/4.safetensors", std::ios::binary);
  const std::string ha((std::istreambuf_iterator<char>(fa)), {}),
      hb((std::istreambuf_iterator<char>(fb)), {});
  EXPECT_FALSE(ha.empty());
  EXPECT_TRUE(ha == hb) << "the resumed run published another head";
}

TEST(RlRun, DraftHeadResumesBitForBit) {
  MILES_REQUIRE_SHARED();
  // The last layer's head, and one on layers 0, 2 and 4 (stage 0 holds two of them).
  for (const std::string layers : {"", " rollout.speculative_draft_layers=[0,2,4]"}) {
    SCOPED_TRACE(layers);
    resume_draft_head(layers);
  }
}

// Engines drafting with the co-trained head (rollout.speculative + speculative_draft_head): each
// weight version's head is published beside it and the engine drafts with the head of the version
// it adopted; the run equals the plain run number for number, and the engines verified the head's
// drafts.
// Also with tensor-parallel engines (`miles serve --tp 2`, versions over disk-delta): rank 0
// drafts from its forwards' hidden states.
TEST(RlRun, EnginesDraftWithTheCoTrainedHeadOfTheirVersion) {
  MILES_REQUIRE_SHARED();
  // One-process engines, tensor-parallel ones, and a head on layers 0, 2 and 4 (EAGLE-3).
  const std::vector<std::pair<std::string, std::string>> variants{
      {"", ""},
      {" rollout.engine_tp=2 weight_sync.transport=disk_delta", ""},
      {"", " rollout.speculative_draft_layers=[0,2,4]"}};
  for (const auto& [engines, layers] : variants) {
    std::string dir;
    expect_same_run(engines.empty() && layers.empty() ? "draft_spec" : "draft_spec_variant",
                    " rollout.num_rollouts=3" + engines,
                    " rollout.speculative=true rollout.speculative_adaptive=false"
                    " rollout.speculative_draft_head=true rollout.speculative_draft_lr=0.003" +
                        layers,
                    "co-trained draft head of each weight version", nullptr, &dir);
    std::ifstream log(dir + "/engines/engine_0.log");
    const std::string engine_log((std::istreambuf_iterator<char>(log)), {});
    EXPECT_NE(engine_log.find("draft head of weight version 2 ("), std::string::npos)
        << engines << layers << engine_log;
    EXPECT_NE(engine_log.find(layers.empty() ? "features of layer 4)" : "layers 0, 2, 4)"),
              std::string::npos)
        << engine_log;
    if (!engines.empty()) {
      EXPECT_NE(engine_log.find("tensor parallel over 2 processes"), std::string::npos)
          << engine_log;
    }
    EXPECT_TRUE(std::filesystem::exists(dir + "/weights/draft/2.safetensors"));
    uint64_t drafted = 0;
    for (const json& m : metrics(dir)) drafted += m.at("spec_draft_tokens").get<uint64_t>();
    EXPECT_GT(drafted, 0u) << engines << layers;
  }
}

// Asking for GPU engines where there is no GPU (or no CUDA build) is refused before any engine
// starts, naming the key and why.
TEST(RlRun, CudaEnginesWithoutAGpuAreRefusedBeforeEnginesStart) {
  MILES_REQUIRE_SHARED();
  if (cuda_available().ok()) GTEST_SKIP() << "a GPU is here";
  const std::string dir = temp_dir("device_cuda");
  auto r = run_here(std::string(kCi) + " --run-dir " + dir + " rollout.engine_device=cuda");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("rollout.engine_device: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CUDA"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/engines/engine_0.log")) << "an engine was started";
}

// A pipeline- and tensor-parallel trainer (pp = 2, tp = 2, four ranks) and two engines.
// Broadcast: one group per stage, stage 1's buckets sent by the trainer rank that leads stage 1
// (after gathering its tensor-parallel shards), not by the controller. p2p: every trainer rank
// sends its own shards straight to the engines, which assemble them. Every rank is on this host, so
// the groups are shared-memory ones (weight_sync.comm auto), p2p over Gloo too. Every run equals
// the disk-delta run of the same layout with |Δlogp| 0.
TEST(RlRun, BroadcastPerStageAndP2pFromEveryRankGiveTheDiskDeltaRun) {
  MILES_REQUIRE_SHARED();
  const std::string ref = temp_dir("bcast_pp_ref"), dir = temp_dir("bcast_pp");
  const std::string job =
      " rollout.num_rollouts=3 rollout.num_engines=2 parallel.pp=2 parallel.tp=2";
  auto rr = run_here(std::string(kCi) + " --run-dir " + ref + job);
  ASSERT_EQ(rr.exit_code, 0) << rr.out;
  // Broadcast (comm auto: every rank and engine is on this host, so shared memory, the stage 1
  // leader included); p2p over Gloo.
  auto r =
      run_here(std::string(kCi) + " --run-dir " + dir + job + " weight_sync.transport=broadcast");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("one group per pipeline stage (2), over shared memory"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("over disk-delta"), std::string::npos) << r.out;  // no fallback
  std::string workers;
  for (int rank = 1; rank < 4; ++rank) {
    std::ifstream f(dir + "/trainer_rank_" + std::to_string(rank) + ".log");
    workers += std::string(std::istreambuf_iterator<char>(f), {});
  }
  EXPECT_NE(workers.find("stage 1: joined weight group wsync-1-s1 (2 engines, shared memory)"),
            std::string::npos)
      << workers;
  for (int v = 1; v <= 3; ++v)
    EXPECT_EQ(
        count(workers, "stage 1: sent weight version " + std::to_string(v) + " over wsync-1-s1"),
        1u)
        << workers;
  // p2p from every rank, over Gloo and over shared memory.
  std::vector<std::string> dirs = {dir};
  for (const std::string comm : {"gloo", "auto"}) {
    const std::string p2p = temp_dir("p2p_pp_" + comm);
    dirs.push_back(p2p);
    auto rp = run_here(std::string(kCi) + " --run-dir " + p2p + job +
                       " weight_sync.transport=p2p weight_sync.comm=" + comm);
    ASSERT_EQ(rp.exit_code, 0) << rp.out;
    EXPECT_NE(rp.out.find(std::string("p2p from 4 trainer ranks (dp=1,pp=2,tp=2), over ") +
                          (comm == "gloo" ? "TCP (gloo)" : "shared memory")),
              std::string::npos)
        << rp.out;
    EXPECT_EQ(rp.out.find("over disk-delta"), std::string::npos) << rp.out;  // no fallback
    for (int rank = 1; rank < 4; ++rank) {
      std::ifstream f(p2p + "/trainer_rank_" + std::to_string(rank) + ".log");
      const std::string log(std::istreambuf_iterator<char>(f), {});
      EXPECT_NE(log.find("rank " + std::to_string(rank) + ": sent its shards of weight version 3"),
                std::string::npos)
          << log;
    }
  }
  auto mr = metrics(ref);
  ASSERT_EQ(mr.size(), 3u);
  for (const std::string& d : dirs) {
    auto m = metrics(d);
    ASSERT_EQ(m.size(), 3u) << d;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(m[i]["logp_abs_diff_max"], 0.0) << m[i].dump();
      EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << d << " step " << i + 1;
    }
  }
}

// An engine killed mid-run under the broadcast transport: it catches up over disk-delta when it
// comes back, the group is formed anew (with it, once it is ready), and nothing changes.
TEST(RlRun, BroadcastTransportSurvivesAKilledEngine) {
  MILES_REQUIRE_SHARED();
  const std::string ref = temp_dir("bcast_kill_ref"), dir = temp_dir("bcast_kill");
  auto rr = run_here(std::string(kCi) + " --run-dir " + ref + " rollout.num_rollouts=6");
  ASSERT_EQ(rr.exit_code, 0) << rr.out;
  auto r = run_killing_an_engine(dir, " weight_sync.transport=broadcast");
  expect_killed_run_unchanged(r, dir, ref);
  // Formed anew when the engine died; the restarted engine (ready within a step or two) is in the
  // last group.
  EXPECT_GE(count(r.out, "formed:"), 2u) << r.out;
  const size_t last = r.out.rfind("formed:");
  EXPECT_EQ(r.out.compare(last, 17, "formed: 2 engines"), 0) << r.out;
  for (const json& s : metrics(dir)) EXPECT_EQ(s["logp_abs_diff_max"], 0.0) << s.dump();
}

TEST(RlRun, OneStepOffSamplesAreExactlyOneVersionStale) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("off");
  auto r = run_here(std::string(kCi) + " --run-dir " + dir +
                    " rollout.num_rollouts=5 async.mode=one_step_off");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = metrics(dir);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0]["staleness_max"], 0.0);  // step 1 trains on version-0 samples at version 0
  for (size_t i = 1; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["staleness_max"], 1.0) << m[i].dump();
    EXPECT_EQ(m[i]["staleness_mean"], 1.0) << m[i].dump();
  }
}

TEST(RlRun, AsyncKeepsTheStalenessBoundThroughPartialRollouts) {
  MILES_REQUIRE_SHARED();
  int64_t partial = 0;  // samples whose tokens came from two weight versions
  for (const char* mode : {"retract", "in_place", "abort"}) {
    const std::string dir = temp_dir(std::string("async_") + mode);
    auto r = run_here(std::string(kCi) + " --run-dir " + dir +
                      " rollout.num_rollouts=5 async.mode=async async.max_weight_staleness=1"
                      " async.buffer_groups=16 async.pause_mode=" +
                      mode + (std::string(mode) == "in_place" ? " async.stale_policy=retry" : ""));
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.out;
    auto m = metrics(dir);
    ASSERT_EQ(m.size(), 5u) << mode;
    for (const json& s : m) {
      EXPECT_EQ(s["samples"], 32) << mode;
      EXPECT_LE(s["staleness_max"].get<double>(), 1.0) << mode << " " << s.dump();
      partial += s["multi_version_samples"].get<int64_t>();
      if (std::string(mode) == "in_place") {
        EXPECT_EQ(s["groups_stale_dropped"], 0) << s.dump();
      }
      if (std::string(mode) != "abort") {
        EXPECT_EQ(s["continued_samples"], 0) << mode;
      }
    }
  }
  EXPECT_GT(partial, 0) << "no sample crossed a weight update in 15 async steps";
}

// A free TCP port on a loopback address (bind, read, release); 0 when the family is unavailable.
int free_loopback_port(bool ipv6) {
  int port = 0;
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (ipv6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *a;
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    port = ntohs(ipv6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  close(fd);
  return port;
}

// `miles serve --controller HOST:PORT` started by hand on `host` registers with the controller,
// which then runs the job on it (extra: more overrides).
std::string expect_engine_registers(const std::string& name, const std::string& host, bool ipv6,
                                    const std::string& extra) {
  // The engine started by hand knows the run's token: the controller's MILES_RUN_TOKEN is its
  // MILES_API_KEY (as in scripts/slurm and scripts/k8s).
  ::setenv("MILES_RUN_TOKEN", "run-token-for-the-test", 1);
  const std::string dir = temp_dir(name);
  const int port = free_loopback_port(ipv6);
  EXPECT_GT(port, 0);
  const std::string controller = (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  const std::string engine_log = dir + "/engine.log";
  const std::string serve = "MILES_API_KEY=run-token-for-the-test " + test::miles_binary() +
                            " serve --model " + test::shared_dir() +
                            "/models/stories260K/stories260K.bin --threads 1 --port 0 --host " +
                            host + " --weights-dir '" + dir + "/weights' --controller '" +
                            controller + "' > " + engine_log + " 2>&1 & echo $!";
  FILE* p = popen(serve.c_str(), "r");
  char buf[64] = {0};
  EXPECT_TRUE(fgets(buf, sizeof buf, p));
  pclose(p);
  const pid_t engine = static_cast<pid_t>(std::atol(buf));
  auto r = run_here(std::string(kCi) + " --run-dir " + dir +
                    " rollout.num_rollouts=2 rollout.num_engines=0 'controller.host=" + host +
                    "' controller.port=" + std::to_string(port) + extra);
  kill(engine, SIGTERM);
  ::unsetenv("MILES_RUN_TOKEN");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("controller listening on " + controller), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("engine 0 registered"), std::string::npos) << r.out;
  const auto m = metrics(dir);
  EXPECT_EQ(m.size(), 2u);
  for (const json& s : m) EXPECT_EQ(s["logp_abs_diff_max"], 0.0) << s.dump();
  return r.out;
}

// An engine without the run's token is refused by the controller, and says so.
TEST(RlRun, EngineWithoutTheRunTokenIsRefused) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("refused");
  const int port = free_loopback_port(false);
  const std::string controller = "127.0.0.1:" + std::to_string(port);
  const std::string engine_log = dir + "/engine.log";
  const std::string serve = "MILES_API_KEY=not-the-token " + test::miles_binary() +
                            " serve --model " + test::shared_dir() +
                            "/models/stories260K/stories260K.bin --threads 1 --port 0 "
                            "--controller '" +
                            controller + "' > " + engine_log + " 2>&1 & echo $!";
  FILE* p = popen(serve.c_str(), "r");
  char buf[64] = {0};
  EXPECT_TRUE(fgets(buf, sizeof buf, p));
  pclose(p);
  const pid_t engine = static_cast<pid_t>(std::atol(buf));
  ::setenv("MILES_RUN_TOKEN", "the-run-token", 1);
  auto r =
      run_here(std::string(kCi) + " --run-dir " + dir +
               " rollout.num_rollouts=1 rollout.num_engines=0 rollout.engine_start_timeout_s=8 "
               "controller.host=127.0.0.1 controller.port=" +
               std::to_string(port));
  ::unsetenv("MILES_RUN_TOKEN");
  kill(engine, SIGTERM);
  EXPECT_NE(r.exit_code, 0) << r.out;
  std::ifstream in(engine_log);
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("refused"), std::string::npos) << log;
  EXPECT_NE(log.find("token"), std::string::npos) << log;
}

TEST(RlRun, EngineStartedElsewhereRegistersItself) {
  MILES_REQUIRE_SHARED();
  expect_engine_registers("register", "127.0.0.1", false, "");
}

// The same over IPv6 loopback, with the broadcast transport (its store and Gloo group on ::1 too).
TEST(RlRun, ControllerAndEngineOverIpv6) {
  MILES_REQUIRE_SHARED();
  if (free_loopback_port(true) == 0) GTEST_SKIP() << "no IPv6 loopback here";
  const std::string out =
      expect_engine_registers("register_v6", "::1", true, " weight_sync.transport=broadcast");
  EXPECT_NE(out.find("weight group wsync-1 formed: 1 engine"), std::string::npos) << out;
  EXPECT_EQ(out.find("over disk-delta"), std::string::npos) << out;  // no fallback
}

// An engine split the model cannot take is refused before any engine starts, naming the key and
// the dimension (stories260K has 8 heads and 4 KV heads).
TEST(RlRun, EngineTpThatDoesNotSplitTheModelIsRefusedBeforeEnginesStart) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("engine_tp_bad");
  auto r = run_here(std::string(kCi) + " --run-dir " + dir + " rollout.engine_tp=3");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("rollout.engine_tp: num_attention_heads = 8 does not split over tp=3"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/engines/engine_0.log")) << "an engine was started";
}

TEST(RlRun, BadConfigFailsBeforeAnythingStartsWithTheLine) {
  const std::string dir = temp_dir("bad");
  std::ofstream(dir + "/job.yaml") << "model:\n  path: m.bin\nrollout:\n  n_samples_per_promt: 4\n";
  auto r = run("'" + dir + "/job.yaml'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("job.yaml:4: rollout.n_samples_per_promt: unknown key (did you mean "
                       "n_samples_per_prompt?)"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// Runs `miles bench step <args> --run-dir dir --out dir/bench.json`; its output, or a failure.
::testing::AssertionResult bench_step(const std::string& args, const std::string& dir) {
  const std::string cmd = cd_source() + test::miles_binary() + " bench step " + args +
                          " --run-dir " + dir + " --out " + dir + "/bench.json 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return ::testing::AssertionFailure() << out;
  return ::testing::AssertionSuccess();
}

TEST(RlRun, BenchStepRunsTheThreeSchedulesOnOneJob) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("bench");
  ASSERT_TRUE(bench_step("configs/quickstart_ci.yaml --steps 3", dir));
  std::ifstream in(dir + "/bench.json");
  json j = json::parse(in);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["mode"], "sync");
  EXPECT_EQ(j[0]["step_vs_sync"], 1.0);
  EXPECT_EQ(j[1]["mode"], "one_step_off");
  EXPECT_EQ(j[2]["mode"], "async");
  for (const json& m : j) EXPECT_GT(m["step_s"].get<double>(), 0) << m.dump();
}

// --spec: off, the suffix drafter and the co-trained head in one schedule; the head's training
// passes reach its run alone (the others have no head to train).
TEST(RlRun, BenchStepSpecTrainsTheHeadOnItsOwnDraftsInItsRunOnly) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("bench_spec");
  ASSERT_TRUE(
      bench_step("configs/quickstart_ci.yaml --spec --steps 3 --spec-head-ttt-length 2", dir));
  std::ifstream in(dir + "/bench.json");
  const json j = json::parse(in);
  ASSERT_EQ(j.size(), 3u);
  const char* modes[] = {"spec_off", "spec_suffix", "spec_head"};
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(j[m]["mode"], modes[m]);
    std::ifstream metrics(dir + "/" + modes[m] + "/metrics.jsonl");
    std::string line;
    int64_t steps = 0;
    while (std::getline(metrics, line)) {
      const json row = json::parse(line);
      EXPECT_EQ(row.contains("draft_loss_2"), m == 2) << modes[m] << ": " << line;
      EXPECT_FALSE(row.contains("draft_loss_3")) << line;
      ++steps;
    }
    EXPECT_EQ(steps, 3) << modes[m];
  }
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// The trainer group: dp and pp ranks (miles train-worker processes) give the single-process run bit
// for bit; tp's forward is bitwise (its logprobs equal the engine's on every step, since the engine
// gets the weights tp trained) and its gradients within 1e-6 (column-parallel input gradients).
TEST(RlRun, TrainerLayoutsGiveTheSingleProcessRun) {
  MILES_REQUIRE_SHARED();
  const std::string ref = temp_dir("layout_ref");
  ASSERT_EQ(run_here(std::string(kCi) + " --run-dir " + ref + " rollout.num_rollouts=3").exit_code,
            0);
  const auto mr = metrics(ref);
  ASSERT_EQ(mr.size(), 3u);
  // The ranks talk over shared memory (parallel.comm's default); one layout again over Gloo.
  for (const char* layout :
       {"parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "parallel.pp=2 parallel.comm=gloo"}) {
    std::string name = std::string("layout_") + layout;
    std::replace(name.begin(), name.end(), ' ', '_');
    const std::string dir = temp_dir(name);
    auto r = run_here(std::string(kCi) + " --run-dir " + dir + " rollout.num_rollouts=3 " + layout);
    ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.out;
    EXPECT_NE(r.out.find("trainer group: 2 ranks"), std::string::npos) << r.out;
    const auto m = metrics(dir);
    ASSERT_EQ(m.size(), 3u) << layout;
    for (size_t i = 0; i < m.size(); ++i) {
      if (std::string(layout) != "parallel.tp=2") {
        EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << layout << " step " << i + 1;
        EXPECT_EQ(m[i]["logp_diff_nonzero_frac"], 0.0) << layout;
      } else {
        EXPECT_EQ(m[i]["logp_diff_nonzero_frac"], 0.0) << m[i].dump();
        EXPECT_EQ(m[i]["logp_abs_diff_max"], 0.0) << m[i].dump();
        const double g = m[i]["grad_norm"].get<double>(), gr = mr[i]["grad_norm"].get<double>();
        EXPECT_LE(std::fabs(g - gr), 1e-5 * std::max(1.0, gr)) << m[i].dump();
      }
    }
  }
  // Pipeline stage 1 as a remote rank: the controller keeps it for `miles train-worker
  // --controller` (started here before the run, reading the address from RUN_DIR/controller.json as
  // an operator would), which takes it; the numbers are the single-process run's.
  const std::string dir = temp_dir("layout_remote");
  const std::string bin = "'" + test::miles_binary() + "'";
  const std::string worker =
      "(while [ ! -s " + dir + "/controller.json ]; do sleep 0.1; done; exec " + bin +
      " train-worker --controller \"$(sed -n 's/.*\"address\":\"\\([^\"]*\\)\".*/\\1/p' " + dir +
      "/controller.json)\" > " + dir + "/worker.log 2>&1) & ";
  const test::CliRun r = test::run_shell(
      "cd '" + test::source_dir() + "' || exit 1; export MILES_RUN_TOKEN=remote-rank-token; " +
      worker + bin + " run " + kCi + " --run-dir " + dir +
      " rollout.num_rollouts=3 parallel.pp=2 parallel.comm=gloo parallel.remote_ranks=1 2>&1;"
      " rc=$?; wait; exit $rc");
  std::ifstream log_in(dir + "/worker.log");
  const std::string worker_log((std::istreambuf_iterator<char>(log_in)),
                               std::istreambuf_iterator<char>());
  ASSERT_EQ(r.exit_code, 0) << r.out << "\n--- worker:\n" << worker_log;
  EXPECT_NE(r.out.find("waiting for 1 remote trainer rank(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trainer rank 1 joined from 127.0.0.1"), std::string::npos) << r.out;
  EXPECT_NE(worker_log.find("rank 1 of 2"), std::string::npos) << worker_log;
  const auto m = metrics(dir);
  ASSERT_EQ(m.size(), 3u);
  for (size_t i = 0; i < m.size(); ++i)
    EXPECT_EQ(numbers(m[i]), numbers(mr[i])) << "step " << i + 1;
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

// A custom reward as an external command (JSON lines), with over-sampling and zero-variance
// filtering: every step still trains on 4 groups, each with signal unless the batch had to be
// filled; the command's score is the reward.
TEST(RlRun, CommandRewardWithOverSamplingAndZeroVarianceFilter) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("command");
  const std::string reward = dog_command_reward(dir);
  auto r = run_here(std::string(kCi) + " --run-dir " + dir +
                    " rollout.num_rollouts=4 rollout.over_sampling_batch_size=6"
                    " rollout.filter_zero_variance=true logging.samples_keep=2" +
                    reward);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = metrics(dir);
  ASSERT_EQ(m.size(), 4u);
  // The sample dump: the newest 2 steps kept; each line one trained sample whose reward is the
  // command's verdict on its response, and the file's mean the step's reward mean.
  EXPECT_FALSE(fs::exists(dir + "/samples/step_2.jsonl"));
  for (int step : {3, 4}) {
    const std::vector<json> dump = jsonl(dir + "/samples/step_" + std::to_string(step) + ".jsonl");
    ASSERT_EQ(dump.size(), 32u) << "the sample dump of step " << step;
    double sum = 0;
    for (const json& j : dump) {
      const std::string line = j.dump();
      const bool dog = j["response"].get<std::string>().find("dog") != std::string::npos;
      EXPECT_EQ(j["reward"], dog ? 1.0 : 0.0) << line;
      EXPECT_EQ(j["reward_parts"]["dog"], j["reward"]);
      EXPECT_EQ(j["response_ids"].size(), j["logprobs"].size());
      EXPECT_EQ(j["weight_versions"].size(), j["logprobs"].size());
      EXPECT_EQ(j["step"], step);
      sum += j["reward"].get<double>();
    }
    EXPECT_NEAR(sum / dump.size(), m[step - 1]["reward_mean"].get<double>(), 1e-12);
  }
  for (const json& s : m) {
    EXPECT_EQ(s["samples"], 32);
    EXPECT_EQ(s["reward_errors"], 0.0) << s.dump();
    EXPECT_GE(s["groups_launched"].get<int64_t>(), 6);
    EXPECT_EQ(s["reward_mean"], s["reward_dog_mean"]);
    if (!s["filled_with_filtered"].get<bool>()) {  // every group kept has signal
      EXPECT_GT(s["reward_std"].get<double>(), 0.0) << s.dump();
      EXPECT_EQ(s["groups_without_signal"], 0);
    }
  }
  EXPECT_NE(r.out.find("groups 4/"), std::string::npos) << r.out;  // kept / drawn on the line
}

// A Python reward in the run (the embedded interpreter, called from the controller's rollout
// threads) gives the run of the same grader as an external command, bit for bit; its failures land
// on the samples with the Python traceback, and the run goes on.
TEST(RlRun, PythonRewardGivesTheCommandRewardsRun) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("python");
  const std::string a = dir + "/command", b = dir + "/python", c = dir + "/failing";
  const std::string reward = dog_command_reward(dir);
  std::ofstream(dir + "/dog_reward.py") << "def score(sample):\n"
                                           "    return 'dog' in sample['response']\n"
                                           "def picky(sample):\n"
                                           "    if 'dog' not in sample['response']:\n"
                                           "        raise LookupError('no dog here')\n"
                                           "    return 1.0\n";
  auto python = [&](const std::string& fn) {
    return " 'rewards=[{kind: python, function: \"dog_reward:" + fn + "\", python_path: \"" + dir +
           "\", name: dog}]'";
  };
  auto ra = run_here(std::string(kCi) + " --run-dir " + a + " rollout.num_rollouts=2" + reward);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto rb =
      run_here(std::string(kCi) + " --run-dir " + b + " rollout.num_rollouts=2" + python("score"));
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  const auto ma = metrics(a), mb = metrics(b);
  ASSERT_EQ(ma.size(), 2u);
  ASSERT_EQ(mb.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(numbers(mb[i]), numbers(ma[i])) << "step " << i + 1;
    EXPECT_EQ(mb[i]["reward_dog_mean"], ma[i]["reward_dog_mean"]);
    EXPECT_EQ(mb[i]["reward_errors"], 0.0);
  }
  auto rc = run_here(std::string(kCi) + " --run-dir " + c +
                     " rollout.num_rollouts=1 logging.samples_every=1" + python("picky"));
  ASSERT_EQ(rc.exit_code, 0) << rc.out;
  const auto mc = metrics(c);
  ASSERT_EQ(mc.size(), 1u);
  const double errors = mc[0]["reward_errors"].get<double>();
  EXPECT_GT(errors, 0.0) << mc[0].dump();
  size_t with_traceback = 0;
  for (const json& j : jsonl(c + "/samples/step_1.jsonl")) {
    const std::string e = j.value("reward_error", "");
    with_traceback += e.find("LookupError: no dog here") != std::string::npos &&
                      e.find("dog_reward.py\", line 5, in picky") != std::string::npos;
  }
  EXPECT_EQ(static_cast<double>(with_traceback), errors);
}

// The eval loop: before step 1, every 2 steps and after the last, on fixed seeds; its numbers are
// in eval.jsonl and in the step's metrics line; `miles eval` of the initial model reproduces the
// step-0 evaluation and `miles eval --checkpoint` of the final checkpoint the last one, bit for
// bit.
TEST(RlRun, EvalLoopOnHeldOutPromptsAndMilesEvalReproduceEachOther) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("eval");
  const std::string eval =
      " eval.data=configs/data/stories_dog.jsonl eval.n_samples=2"
      " eval.temperature=1.0 eval.max_prompts=4 eval.pass_threshold=0.5";
  auto r = run_here(std::string(kCi) + " --run-dir " + dir + eval +
                    " eval.every=2 rollout.num_rollouts=3 checkpoint.save_final=true");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<json> evals = jsonl(dir + "/eval.jsonl");
  ASSERT_EQ(evals.size(), 3u);  // steps 0, 2 and 3 (the last)
  EXPECT_EQ(evals[0]["step"], 0);
  EXPECT_EQ(evals[1]["step"], 2);
  EXPECT_EQ(evals[2]["step"], 3);
  EXPECT_EQ(evals[0]["eval_weight_version"], 0);
  EXPECT_EQ(evals[2]["eval_weight_version"], 3);
  for (const json& e : evals) {
    EXPECT_EQ(e["eval_prompts"], 4);
    EXPECT_EQ(e["eval_samples"], 8);
    EXPECT_GE(e["eval_pass_at_2"].get<double>(), e["eval_pass_at_1"].get<double>());
  }
  auto m = metrics(dir);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_FALSE(m[0].contains("eval_reward_mean"));
  EXPECT_EQ(m[1]["eval_reward_mean"], evals[1]["eval_reward_mean"]);
  EXPECT_EQ(m[2]["eval_pass_at_1"], evals[2]["eval_pass_at_1"]);
  EXPECT_NE(r.out.find("evaluations; eval reward"), std::string::npos) << r.out;
  // Each evaluation's samples: eval_samples/step_N.jsonl, whose rewards make its figures.
  for (const json& e : evals) {
    const std::vector<json> s =
        jsonl(dir + "/eval_samples/step_" + std::to_string(e["step"].get<int>()) + ".jsonl");
    ASSERT_EQ(s.size(), 8u) << e.dump();
    double reward = 0;
    for (const json& x : s) {
      reward += x["reward"].get<double>() / 8;
      EXPECT_TRUE(x.contains("response") && x.contains("label") && x.contains("reward_parts"));
      EXPECT_FALSE(x.contains("advantage"));
    }
    EXPECT_NEAR(reward, e["eval_reward_mean"].get<double>(), 1e-12) << e.dump();
  }

  auto same = [](const json& a, const json& b) {
    for (const char* k : {"eval_reward_mean", "eval_pass_at_1", "eval_pass_at_2",
                          "eval_response_length_mean", "eval_weight_version"})
      EXPECT_EQ(a[k], b[k]) << k << ": " << a.dump() << " vs " << b.dump();
  };
  auto first =
      test::run_miles_in_source("eval " + std::string(kCi) + eval + " --run-dir " + dir + "/eval0");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  same(json::parse(std::ifstream(dir + "/eval0/eval.json")), evals[0]);
  EXPECT_EQ(jsonl(dir + "/eval0/eval_samples/step_0.jsonl"),
            jsonl(dir + "/eval_samples/step_0.jsonl"));
  auto last = test::run_miles_in_source("eval " + std::string(kCi) + eval + " --run-dir " + dir +
                                        "/eval3 --checkpoint " + dir + "/checkpoints");
  ASSERT_EQ(last.exit_code, 0) << last.out;
  same(json::parse(std::ifstream(dir + "/eval3/eval.json")), evals[2]);
  // A checkpoint folder without a checkpoint is an error, not the initial model's numbers.
  fs::create_directories(dir + "/empty");
  auto none = test::run_miles_in_source("eval " + std::string(kCi) + eval + " --run-dir " + dir +
                                        "/eval_none --checkpoint " + dir + "/empty");
  EXPECT_NE(none.exit_code, 0) << none.out;
  EXPECT_NE(none.out.find("holds no checkpoint to evaluate"), std::string::npos) << none.out;
  EXPECT_FALSE(fs::exists(dir + "/eval_none/eval.json"));
}

// A saturated task (every reward equal) under dynamic sampling: the async schedule stops drawing
// after 8 × the batch's groups, fills the step with groups without signal and says so, instead
// of drawing forever.
TEST(RlRun, DynamicSamplingOnASaturatedTaskIsBoundedAndSaysSo) {
  MILES_REQUIRE_SHARED();
  const std::string dir = temp_dir("saturated");
  auto r =
      run_here(std::string(kCi) + " --run-dir " + dir +
               " rollout.num_rollouts=2 rollout.rollout_batch_size=2 trainer.global_batch_size=16"
               " rollout.filter_zero_variance=true async.mode=async" +
               command_reward(dir, "one", "while read -r line; do echo '{\"score\": 1}'; done\n"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = metrics(dir);
  ASSERT_EQ(m.size(), 2u);
  for (const json& s : m) {
    EXPECT_TRUE(s["filled_with_filtered"].get<bool>()) << s.dump();
    EXPECT_EQ(s["groups_without_signal"], 2) << s.dump();
    EXPECT_GE(s["groups_filtered"].get<int64_t>(), 14) << s.dump();
  }
  EXPECT_NE(r.out.find("The task looks saturated"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace miles

namespace miles {
namespace {

bool has_smollm2() {
  return fs::exists(test::source_dir() + "/models/smollm2-135m-instruct/model.safetensors");
}

// Small calculator sessions: 2 prompts × 2 samples, one step.
constexpr const char* kSmallCalculator =
    "configs/smollm2_calculator.yaml rollout.num_rollouts=1 rollout.max_new_tokens=40 "
    "rollout.rollout_batch_size=2 rollout.n_samples_per_prompt=4 trainer.global_batch_size=8 "
    "trainer.micro_batch_size=4 logging.progress=none logging.samples_every=1";

// Agentic: SmolLM2 in calculator sessions. Samples whose turn contained a tool call continue after
// the tool message; the trainer consumes the exact session record (tool turns masked out) and its
// logprobs equal the engines' on every policy token, across turns. rollout.function: the same
// environment written in Python (examples/calculator_agent) drives each sample's TITO session
// through its client and gives the built-in environment's run bit for bit: the same turns, tool
// messages, token records, rewards and training step.
TEST(RlRun, CalculatorSessionsBuiltInAndInPythonTrainOnTheSameExactRecord) {
  if (!has_smollm2()) GTEST_SKIP() << "SmolLM2-135M-Instruct not installed (scripts/get_models.sh)";
  const std::string dir = temp_dir("rollout_function");
  const std::string a = dir + "/builtin", b = dir + "/python";
  auto ra = run_here(std::string(kSmallCalculator) + " --run-dir " + a);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto rb = run_here(std::string(kSmallCalculator) + " --run-dir " + b +
                     " rollout.environment=none rollout.function=agent:run"
                     " rollout.python_path=examples/calculator_agent");
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  const auto ma = metrics(a), mb = metrics(b);
  ASSERT_EQ(ma.size(), 1u);
  ASSERT_EQ(mb.size(), 1u);
  EXPECT_EQ(ma[0]["samples"], 8);
  EXPECT_GT(ma[0]["multi_turn_samples"].get<int64_t>(), 0) << ma[0].dump();
  EXPECT_EQ(ma[0]["session_append_errors"], 0) << ma[0].dump();
  EXPECT_EQ(ma[0]["logp_abs_diff_max"], 0.0) << ma[0].dump();
  EXPECT_EQ(ma[0]["ppo_kl"], 0.0);
  EXPECT_EQ(ma[0]["clipfrac"], 0.0);
  EXPECT_EQ(numbers(mb[0]), numbers(ma[0]));
  for (const char* k : {"multi_turn_samples", "turns_mean", "session_append_errors"})
    EXPECT_EQ(mb[0][k], ma[0][k]) << k;
  EXPECT_GT(mb[0]["multi_turn_samples"].get<int64_t>(), 0) << mb[0].dump();
  EXPECT_EQ(mb[0]["rollout_errors"], 0);
  EXPECT_EQ(mb[0]["logp_abs_diff_max"], 0.0);
  const auto sa = jsonl(a + "/samples/step_1.jsonl"), sb = jsonl(b + "/samples/step_1.jsonl");
  ASSERT_EQ(sa.size(), 8u);
  ASSERT_EQ(sb.size(), sa.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sb[i]["trajectory_text"], sa[i]["trajectory_text"]) << i;
    EXPECT_EQ(sb[i]["response_ids"], sa[i]["response_ids"]) << i;
    EXPECT_EQ(sb[i]["logprobs"], sa[i]["logprobs"]) << i;
    EXPECT_TRUE(sb[i]["rollout_result"].contains("tool_calls")) << sb[i].dump();
  }
}

// Learning, as a regression test: the first 5 steps of configs/smollm2_arithmetic.yaml (the recipe
// of docs/recipes.md) raise SmolLM2's greedy accuracy on the 128 held-out prompts from 20 / 128
// (what transformers' greedy generate of the same model also gets: scripts/trl_grpo.py's step-0
// evaluation) by at least 5 points (measured: 15.6 % -> 22.7 %; the recorded run reaches 44.5 % at
// step 40), and the training reward of steps 4-5 is above that of steps 1-2. Five steps, not ten:
// the run is the same bits on every machine, and it holds both cores alone in CI (6.5 minutes).
TEST(RlRun, SmolLM2ArithmeticRecipeLearnsOnHeldOutPrompts) {
  if (!has_smollm2()) GTEST_SKIP() << "SmolLM2-135M-Instruct not installed (scripts/get_models.sh)";
  const std::string dir = temp_dir("smollm2_learns");
  auto r = run_here("configs/smollm2_arithmetic.yaml --run-dir " + dir +
                    " rollout.num_rollouts=5 checkpoint.save_every=0 checkpoint.save_final=true"
                    " logging.progress=none logging.tensorboard=false");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // The checkpoint is a model directory: the policy's tokenizer and chat template beside it.
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(dir + "/checkpoints/step_00000005/" + std::string(f))) << f;
  const std::vector<json> evals = jsonl(dir + "/eval.jsonl");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0]["eval_prompts"], 128);
  EXPECT_EQ(evals[0]["eval_pass_at_1"], 20.0 / 128) << evals[0].dump();
  const double before = evals[0]["eval_pass_at_1"], after = evals[1]["eval_pass_at_1"];
  std::printf("[ learns   ] held-out pass@1 %.4f -> %.4f after 5 steps\n", before, after);
  EXPECT_GE(after, before + 0.05) << evals[1].dump();
  const std::vector<json> m = metrics(dir);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_GT(mean_reward(m, 3, 2), mean_reward(m, 0, 2));
}

// A rollout function that raises keeps its traceback on the sample (the dump, the console, the
// rollout_errors metric) and the run goes on: the failed samples fill their batch slots with
// nothing to train (mask 0), the others train as usual; `kind: rollout` scores what it returned.
TEST(RlRun, RolloutFunctionErrorsStayOnTheirSamples) {
  if (!has_smollm2()) GTEST_SKIP() << "SmolLM2-135M-Instruct not installed (scripts/get_models.sh)";
  const std::string dir = temp_dir("rollout_function_errors");
  std::ofstream(dir + "/flaky_agent.py")
      << "async def run(client, sample):\n"
         "    if sample['index'] == 0:\n"
         "        raise LookupError('no tool here')\n"
         "    reply = await client.chat(sample['messages'], max_new_tokens=8)\n"
         "    if sample['index'] == 1:\n"
         "        raise KeyError('after a turn')\n"
         "    return {'reward': float(sample['index'] == 2), 'turn': reply['content']}\n";
  auto r = run_here(
      "configs/smollm2_calculator.yaml --run-dir " + dir +
      "/run rollout.num_rollouts=2 rollout.max_new_tokens=8 rollout.rollout_batch_size=1 "
      "rollout.n_samples_per_prompt=4 trainer.global_batch_size=4 trainer.micro_batch_size=4 "
      "logging.progress=none logging.samples_every=1 rollout.environment=none "
      "rollout.function=flaky_agent:run rollout.python_path=" +
      dir + " 'rewards=[{kind: rollout}]'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("2 sample(s) failed in the rollout function"), std::string::npos) << r.out;
  const auto m = metrics(dir + "/run");
  ASSERT_EQ(m.size(), 2u);
  for (const json& step : m) {
    EXPECT_EQ(step["rollout_errors"], 2) << step.dump();
    EXPECT_EQ(step["reward_errors"], 0) << step.dump();
    EXPECT_EQ(step["logp_abs_diff_max"], 0.0) << step.dump();
    EXPECT_TRUE(std::isfinite(step["loss"].get<double>())) << step.dump();
  }
  const auto samples = jsonl(dir + "/run/samples/step_1.jsonl");
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_NE(samples[0]["rollout_error"].get<std::string>().find("LookupError: no tool here"),
            std::string::npos);
  EXPECT_NE(samples[0]["rollout_error"].get<std::string>().find("flaky_agent.py\", line 3"),
            std::string::npos)
      << samples[0]["rollout_error"];
  EXPECT_NE(samples[1]["rollout_error"].get<std::string>().find("KeyError: 'after a turn'"),
            std::string::npos);
  EXPECT_FALSE(samples[2].contains("rollout_error"));
  EXPECT_EQ(samples[2]["reward"], 1.0);
  EXPECT_EQ(samples[3]["reward"], 0.0);
  EXPECT_EQ(samples[2]["advantage"], -samples[3]["advantage"].get<double>());
  EXPECT_EQ(samples[0]["advantage"], 0.0);
  EXPECT_TRUE(samples[3]["rollout_result"].contains("turn")) << samples[3].dump();
}

}  // namespace
}  // namespace miles
