// `miles run` across two "hosts": the controller in one network namespace, a `miles serve`
// engine in another, joined by a veth pair (10.77.0.1/24 and 10.77.0.2/24).
//
// Why: this is how Slurm and Kubernetes deployments look (scripts/slurm, scripts/k8s): the
// controller listens on a routable address, and an engine started elsewhere registers itself with
// `--controller HOST:PORT` and is called back at the address it advertises (or the one the
// controller sees). Loopback tests cannot catch a controller bound to 127.0.0.1, an engine that
// advertises 0.0.0.0, or a weight directory the engine resolves against its own working directory.
// The namespaces, the veth pair and every process in them are removed on every exit path (RAII).
// Skips when not root, when `ip netns`/veth are unavailable, or when ../shared is missing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "test_paths.h"

namespace miles {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kHostA = "10.77.0.1";  // the controller's namespace
constexpr const char* kHostB = "10.77.0.2";  // the engine's namespace
constexpr int kControllerPort = 29517;       // free: the namespaces are new

// Runs `cmd` with /bin/sh; its exit code and output (stdout and stderr).
test::CliRun sh(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

bool netns_exists(const std::string& name) {
  const test::CliRun r = sh("ip netns list");
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line))
    if (line.substr(0, line.find(' ')) == name) return true;
  return false;
}

// Two namespaces joined by a veth pair, each with lo up. Names carry the pid (parallel runs).
class TwoHosts {
 public:
  TwoHosts()
      : a_("miles_a_" + std::to_string(getpid())),
        b_("miles_b_" + std::to_string(getpid())),
        veth_a_("mla" + std::to_string(getpid())),
        veth_b_("mlb" + std::to_string(getpid())) {}
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;
  ~TwoHosts() { destroy(); }

  // Empty on success, else why not (what was made is removed again).
  std::string create() {
    const test::CliRun ra = sh("ip netns add " + a_);
    if (ra.exit_code != 0) return "`ip netns add` failed: " + ra.out;
    made_a_ = true;
    const test::CliRun rb = sh("ip netns add " + b_);
    if (rb.exit_code != 0) return "`ip netns add` failed: " + rb.out;
    made_b_ = true;
    const test::CliRun rv = sh("ip link add " + veth_a_ + " type veth peer name " + veth_b_);
    if (rv.exit_code != 0) return "cannot create a veth pair: " + rv.out;
    made_veth_ = true;
    for (const std::string& cmd :
         {"ip link set " + veth_a_ + " netns " + a_, "ip link set " + veth_b_ + " netns " + b_,
          "ip -n " + a_ + " addr add " + kHostA + "/24 dev " + veth_a_,
          "ip -n " + b_ + " addr add " + kHostB + "/24 dev " + veth_b_,
          "ip -n " + a_ + " link set lo up", "ip -n " + b_ + " link set lo up",
          "ip -n " + a_ + " link set " + veth_a_ + " up",
          "ip -n " + b_ + " link set " + veth_b_ + " up"}) {
      const test::CliRun r = sh(cmd);
      if (r.exit_code != 0) return "`" + cmd + "` failed: " + r.out;
    }
    // `ip netns exec` mounts a fresh /sys, which some containers forbid.
    const test::CliRun re = sh("ip netns exec " + a_ + " true");
    if (re.exit_code != 0) return "`ip netns exec` failed: " + re.out;
    return "";
  }

  // Kills every process left in the namespaces, then deletes them (the veth pair goes with them).
  void destroy() {
    for (auto [name, made] : {std::pair{a_, &made_a_}, std::pair{b_, &made_b_}}) {
      if (!*made) continue;
      for (int sig : {SIGTERM, SIGKILL}) {
        std::istringstream pids(sh("ip netns pids " + name).out);
        bool any = false;
        for (long pid; pids >> pid;) any |= kill(static_cast<pid_t>(pid), sig) == 0;
        if (any && sig == SIGTERM) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      sh("ip netns del " + name);
      *made = false;
    }
    if (made_veth_) sh("ip link del " + veth_a_ + " 2>/dev/null || true");  // if never moved
    made_veth_ = false;
  }

  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  std::string a_, b_, veth_a_, veth_b_;
  bool made_a_ = false, made_b_ = false, made_veth_ = false;
};

// A process started with fork/exec (output to a log file, working directory `cwd`), killed and
// reaped when this goes out of scope; it also dies with the test process (PR_SET_PDEATHSIG).
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::string& cwd, const std::string& log) {
    pid_ = fork();
    if (pid_ != 0) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || chdir(cwd.c_str()) != 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {  // 5 s to stop, then SIGKILL
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool started() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

std::string temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("miles_netns_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> metrics(const std::string& run_dir) {
  std::vector<json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

struct Scenario {
  std::string name;
  std::string controller_host;  // controller.host (the controller runs in namespace A)
  std::string engine_host;      // `miles serve --host` (the engine runs in namespace B)
  int64_t rollouts = 3;
  // The run directory as given to `miles run` (relative to the source directory when set), and
  // the engine's working directory, to show that the engine needs no shared working directory.
  bool relative_run_dir = false;
  // Trainer ranks on both hosts: pipeline stage 1 is a `miles train-worker --controller` in B.
  bool remote_trainer_rank = false;
};

// Runs the scenario; the namespaces and the engine are gone when it returns (also on failure).
void run_two_hosts(const Scenario& sc, std::string* ns_a, std::string* ns_b) {
  TwoHosts hosts;
  *ns_a = hosts.a();
  *ns_b = hosts.b();
  if (const std::string why = hosts.create(); !why.empty())
    GTEST_SKIP() << "network namespaces unavailable: " << why;
  const std::string dir = temp_dir(sc.name);
  const std::string engine_cwd = dir + "/engine_cwd";
  fs::create_directories(engine_cwd);
  const std::string port = std::to_string(kControllerPort);
  const std::string controller = std::string(kHostA) + ":" + port;

  // The engine first: it retries its registration until the controller listens.
  // The engine knows the run's token (MILES_API_KEY = the controller's MILES_RUN_TOKEN).
  Process engine({"ip", "netns", "exec", hosts.b(), "env", "MILES_API_KEY=netns-run-token",
                  test::miles_binary(), "serve", "--model",
                  test::shared_dir() + "/models/stories260K/stories260K.bin", "--threads", "1",
                  "--host", sc.engine_host, "--port", "0", "--weights-dir", dir + "/weights",
                  "--controller", controller},
                 engine_cwd, dir + "/engine.log");
  ASSERT_TRUE(engine.started());
  // The remote trainer rank, also before the controller: it asks for its seat until it gets one.
  // It works from the checkout (the job's relative paths), like a Slurm step in the submit dir.
  std::optional<Process> worker;
  if (sc.remote_trainer_rank) {
    worker.emplace(std::vector<std::string>{"ip", "netns", "exec", hosts.b(), "env",
                                            "MILES_RUN_TOKEN=netns-run-token", test::miles_binary(),
                                            "train-worker", "--controller", controller},
                   test::source_dir(), dir + "/worker.log");
    ASSERT_TRUE(worker->started());
  }

  const std::string run_dir =
      sc.relative_run_dir ? fs::relative(dir, test::source_dir()).string() : dir;
  const std::string miles_run =
      "cd " + quote(test::source_dir()) +
      " && MILES_RUN_TOKEN=netns-run-token exec timeout -k 5 300 " + quote(test::miles_binary()) +
      " run configs/quickstart_ci.yaml --run-dir " + quote(run_dir) +
      " rollout.num_rollouts=" + std::to_string(sc.rollouts) +
      " rollout.num_engines=0 rollout.engine_start_timeout_s=120 controller.host=" +
      sc.controller_host + " controller.port=" + port +
      (sc.remote_trainer_rank ? " parallel.pp=2 parallel.comm=gloo parallel.remote_ranks=1" : "");
  const test::CliRun r = sh("ip netns exec " + hosts.a() + " sh -c " + quote(miles_run));
  const std::string engine_log = read_file(dir + "/engine.log");
  ASSERT_EQ(r.exit_code, 0) << r.out << "\n--- engine log:\n" << engine_log;
  EXPECT_NE(r.out.find("controller listening on " + sc.controller_host + ":" + port),
            std::string::npos)
      << r.out;
  // The controller calls the engine at its namespace's address, not at 0.0.0.0 or 127.0.0.1.
  EXPECT_NE(r.out.find(std::string("registered at ") + kHostB + ":"), std::string::npos) << r.out;
  EXPECT_NE(engine_log.find("registered with the controller at " + controller), std::string::npos)
      << engine_log;
  if (sc.remote_trainer_rank) {
    const std::string worker_log = read_file(dir + "/worker.log");
    EXPECT_NE(r.out.find(std::string("trainer rank 1 joined from ") + kHostB), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("trainer group: 2 ranks (dp 1, pp 2, tp 1)"), std::string::npos) << r.out;
    EXPECT_NE(worker_log.find(std::string("rank 1 of 2 (controller ") + controller),
              std::string::npos)
        << worker_log;
    EXPECT_NE(worker_log.find(std::string("bound to ") + kHostB), std::string::npos) << worker_log;
  }
  const std::vector<json> m = metrics(dir);
  ASSERT_EQ(m.size(), static_cast<size_t>(sc.rollouts)) << r.out;
  for (const json& s : m) {
    EXPECT_EQ(s["samples"], 32) << s.dump();
    EXPECT_EQ(s["logp_abs_diff_max"], 0.0) << s.dump();  // the engine served the trainer's bits
  }
  fs::remove_all(dir);
}

void expect_no_namespace_left(const std::string& a, const std::string& b) {
  if (::testing::Test::IsSkipped()) return;
  EXPECT_FALSE(netns_exists(a)) << sh("ip netns list").out;
  EXPECT_FALSE(netns_exists(b)) << sh("ip netns list").out;
}

#define REQUIRE_ROOT()                                                             \
  do {                                                                             \
    if (geteuid() != 0) GTEST_SKIP() << "needs root for `ip netns add`; skipping"; \
  } while (0)

// The controller bound to its namespace's address; the engine listens on its own and says so.
TEST(Netns, EngineInAnotherNamespaceRegistersAndServesTheRun) {
  MILES_REQUIRE_SHARED();
  REQUIRE_ROOT();
  std::string a, b;
  run_two_hosts({.name = "addr", .controller_host = kHostA, .engine_host = kHostB}, &a, &b);
  expect_no_namespace_left(a, b);
}

// Trainer ranks on both hosts: the controller keeps pipeline stage 0, stage 1 joins from B with
// `miles train-worker --controller` (its rank, the store and the config from the controller) and
// binds its collectives to B's address; the engine in B serves the trainer's bits.
TEST(Netns, TrainerRankInAnotherNamespaceJoinsTheRun) {
  MILES_REQUIRE_SHARED();
  REQUIRE_ROOT();
  std::string a, b;
  run_two_hosts({.name = "rank",
                 .controller_host = kHostA,
                 .engine_host = kHostB,
                 .rollouts = 2,
                 .remote_trainer_rank = true},
                &a, &b);
  expect_no_namespace_left(a, b);
}

// Both on wildcard addresses (as in a Kubernetes pod without --advertise-host): the controller
// calls the engine at the address the registration came from. The run directory is relative to
// the controller's working directory, which the engine does not share: it must be told the
// absolute weight directory.
TEST(Netns, WildcardEngineIsCalledAtItsPeerAddress) {
  MILES_REQUIRE_SHARED();
  REQUIRE_ROOT();
  std::string a, b;
  run_two_hosts({.name = "wild",
                 .controller_host = "0.0.0.0",
                 .engine_host = "0.0.0.0",
                 .rollouts = 2,
                 .relative_run_dir = true},
                &a, &b);
  expect_no_namespace_left(a, b);
}

}  // namespace
}  // namespace miles
