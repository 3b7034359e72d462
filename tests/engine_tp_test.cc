// A tensor-parallel rollout engine (include/miles/rollout/tp_engine.h): rank 0 and a follower over
// a real Gloo group on loopback give bit for bit the single-process engine's tokens, logprobs and
// routed experts (GRPO forks with partial-block copies, prefix-cache hits, chunked prefill), also
// after a weight update that reshards new weights; a bad update leaves v - 1 serving. Then `miles
// serve
// --tp 2` as real processes: the same bits over HTTP as `miles serve`, a size that does not split
// is refused naming the dimension, and a killed follower ends the server with an error naming the
// group instead of a hang; p2p weight sync hands each rank its own shard straight from the trainer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "engine_workload.h"
#include "miles/comm.h"
#include "miles/controller/child_process.h"
#include "miles/flat_params.h"
#include "miles/rollout/engine.h"
#include "miles/rollout/tp_engine.h"
#include "miles/tcp_store.h"
#include "miles/tensor_parallel.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/weight_sync.h"
#include "test_paths.h"

namespace miles {
namespace {

using test::expect_same_bits;
using test::Finals;
using test::kEngine;
using test::one_process_runner;
using test::run_workload;

using nlohmann::json;

// Rank 0's runner over a follower running on its own thread, both over Gloo on loopback.
struct TpPair {
  std::unique_ptr<TcpStoreServer> store;
  std::unique_ptr<ThreadPool> follower_pool = std::make_unique<ThreadPool>(1);
  std::thread follower;
  Status follower_status;
  std::unique_ptr<ModelRunner> runner;

  Status start(const ModelFiles& files, const EngineOptions& eo, ThreadPool* pool) {
    MILES_ASSIGN_OR_RETURN(store, TcpStoreServer::start({}));
    CommOptions c;
    c.world_size = 2;
    c.store_address = store->address();
    c.timeout = std::chrono::milliseconds(20'000);
    follower = std::thread([this, c]() mutable {
      c.rank = 1;
      auto comm = connect_gloo(c);
      follower_status =
          comm.ok() ? rollout::run_tp_engine_follower(**comm, follower_pool.get()) : comm.status();
    });
    c.rank = 0;
    MILES_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, connect_gloo(c));
    MILES_ASSIGN_OR_RETURN(runner, rollout::make_tp_model_runner(std::move(comm), files.config,
                                                                 files.weights, eo, pool));
    return Status::Ok();
  }
  void join() {
    if (follower.joinable()) follower.join();
  }
  ~TpPair() { join(); }
};

class EngineTp : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineTp, SameBitsAsOneProcess) {
  auto files = load_model_files(test::data_dir() + "/models/" + GetParam());
  ASSERT_TRUE(files.ok()) << files.message();
  ASSERT_TRUE(tensor_parallel::bitwise_split(files->config, 2).ok());
  ThreadPool pool(1);
  Engine one(one_process_runner(*files, &pool), kEngine);
  TpPair tp;
  ASSERT_TRUE(tp.start(*files, kEngine, &pool).ok());
  // Rank 0 holds half the KV heads (MLA: the whole latent, which every head reads).
  EXPECT_EQ(tp.runner->kv_dim() * (files->config.is_mla() ? 1 : 2), files->config.kv_dim());
  Engine two(std::move(tp.runner), kEngine);
  const Finals a = run_workload(one, 5), b = run_workload(two, 5);
  expect_same_bits(a, b);
  int64_t cached = 0;
  for (const auto& [k, e] : b.by_sample) cached += e.cached_tokens;
  EXPECT_GT(cached, 24);  // sibling forks and the prefix hit happened
  EXPECT_EQ(two.stats().free_blocks, one.stats().free_blocks);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineTp,
                         ::testing::Values("qwen3_moe", "llama_tied", "llama_bias", "qwen2",
                                           "mistral", "phi3", "gemma3", "glm4_moe",
                                           "glm4_moe_nonorm", "deepseek_v3"));

// Speculative decoding on a tensor-parallel engine: drafts verified across both ranks (the
// verify rows of every sequence gathered from the vocabulary shards) give the one-process plain
// engine's bits, and rejected positions' blocks are freed.
TEST(EngineTpSpeculative, VerifiedDraftsGiveThePlainOneProcessBits) {
  for (const char* name : {"qwen3_moe", "deepseek_v3"}) {
    auto files = load_model_files(test::data_dir() + "/models/" + name);
    ASSERT_TRUE(files.ok()) << files.message();
    ThreadPool pool(1);
    Engine one(one_process_runner(*files, &pool), kEngine);
    const Finals a = run_workload(one, 5);
    TpPair tp;
    ASSERT_TRUE(tp.start(*files, test::speculative(kEngine), &pool).ok());
    Engine two(std::move(tp.runner), test::speculative(kEngine));
    two.set_drafter(std::make_unique<test::OracleDrafter>(
        a, 3, static_cast<int32_t>(files->config.vocab_size)));
    expect_same_bits(a, run_workload(two, 5));
    const EngineStats s = two.stats();
    EXPECT_GT(s.spec_accepted_tokens, 0u) << name;
    EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << name;
    EXPECT_LT(s.iterations, one.stats().iterations) << name;
    EXPECT_EQ(s.free_blocks, one.stats().free_blocks) << name;
  }
}

// The co-trained draft head on a tensor-parallel engine: rank 0's forward returns the hidden
// states (whole on every rank: the residual stream is all-reduced), so its head drafts exactly
// what a one-process engine's head drafts — the same drafts, the same ones accepted, the same
// head scores — and the samples are the plain one-process bits.
TEST(EngineTpSpeculative, TheDraftHeadDraftsAsOnOneProcess) {
  auto files = load_model_files(test::data_dir() + "/models/llama_tied");
  ASSERT_TRUE(files.ok()) << files.message();
  ThreadPool pool(1);
  for (const std::vector<int64_t> layers : {std::vector<int64_t>{}, std::vector<int64_t>{0, 1}}) {
    TpPair tp;
    ASSERT_TRUE(tp.start(*files, test::speculative(kEngine), &pool).ok());
    Engine two(std::move(tp.runner), test::speculative(kEngine));
    SCOPED_TRACE(layers.size() == 2 ? "feature layers 0, 1" : "the last layer");
    test::expect_head_drafts_as_one_process(*files, two, &pool, layers);
  }
}

TEST(EngineTpWeights, AnUpdateReshardsAndABadOneKeepsTheOldWeights) {
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(files.ok());
  ThreadPool pool(1);
  Engine one(one_process_runner(*files, &pool), kEngine);
  TpPair tp;
  ASSERT_TRUE(tp.start(*files, kEngine, &pool).ok());
  Engine two(std::move(tp.runner), kEngine);
  const Finals before = run_workload(two, 9);

  // New weights: every value nudged (as an optimizer step would).
  const FlatTensors flat = test::nudged_weights(*files);
  const TensorMap next = flat.as_tensor_map();
  test::update_all({&one, &two}, next);
  const Finals a = run_workload(one, 9), b = run_workload(two, 9);
  expect_same_bits(a, b);
  bool changed = false;
  auto old_it = before.by_sample.begin();
  for (const auto& [k, e] : b.by_sample)
    changed |= e.output[0].raw_logprob != (old_it++)->second.output[0].raw_logprob;
  EXPECT_TRUE(changed);

  // A set without the LM head: refused with the tensor's name; the engine keeps serving the
  // weights it had, bit for bit.
  TensorMap broken;
  for (const std::string& n : next.names())
    if (n != "lm_head.weight") broken.insert(n, *next.find(n), "test");
  ASSERT_TRUE(two.begin_weight_update().ok());
  const Status s = two.update_weights(broken);
  ASSERT_TRUE(two.end_weight_update().ok());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lm_head.weight"), std::string::npos) << s.message();
  expect_same_bits(a, run_workload(two, 9), /*same_cache=*/false);
}

// ---- `miles serve --tp 2` as real processes
// -------------------------------------------------------

struct ServeProcess {
  controller::ChildProcess child;
  std::string log;
  int port = 0;

  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Starts `miles serve` with `extra` and waits (up to 60 s) for its port, or for it to exit.
  Status start(const std::string& name, std::vector<std::string> extra) {
    log = test::binary_dir() + "/engine_tp_" + name + ".log";
    std::filesystem::remove(log);
    std::vector<std::string> argv = {test::binary_dir() + "/bin/miles",
                                     "serve",
                                     "--model",
                                     test::data_dir() + "/models/qwen3_moe",
                                     "--port",
                                     "0",
                                     "--threads",
                                     "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    MILES_ASSIGN_OR_RETURN(child, controller::ChildProcess::spawn(argv, log));
    const std::string key = "listening on http://127.0.0.1:";
    for (int i = 0; i < 600; ++i) {
      const std::string text = read(log);
      const size_t at = text.find(key);
      if (at != std::string::npos) {
        port = std::stoi(text.substr(at + key.size()));
        return Status::Ok();
      }
      if (!child.alive()) return Status::Error("exited: " + text);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Status::Error("no port after 60 s: " + read(log));
  }
};

json generate(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  const json body = {
      {"input_ids", {1, 5, 9, 200, 31, 7, 8, 9, 10, 11, 12}},
      {"sampling_params", {{"temperature", 0.9}, {"max_new_tokens", 12}, {"seed", 7}, {"n", 4}}},
      {"return_logprob", true},
      {"return_routed_experts", true}};
  auto r = c.Post("/generate", body.dump(), "application/json");
  if (!r || r->status != 200) return json();
  return json::parse(r->body, nullptr, false);
}

// The children of `pid` named miles (the followers).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

TEST(ServeTp, SameBitsOverHttpAsOneProcessAndAKilledFollowerIsAnError) {
  ServeProcess one, two;
  ASSERT_TRUE(one.start("one", {}).ok());
  Status s = two.start("two", {"--tp", "2"});
  ASSERT_TRUE(s.ok()) << s.message();
  const json a = generate(one.port), b = generate(two.port);
  ASSERT_TRUE(a.is_array() && a.size() == 4) << a.dump();
  ASSERT_TRUE(b.is_array() && b.size() == 4) << b.dump();
  for (size_t i = 0; i < 4; ++i)
    for (const char* k : {"output_token_logprobs", "output_token_raw_logprobs", "routed_experts"})
      EXPECT_EQ(a[i]["meta_info"][k], b[i]["meta_info"][k]) << k << " of sample " << i;
  EXPECT_NE(ServeProcess::read(two.log).find("tensor parallel over 2 processes"),
            std::string::npos);

  // Kill the follower: the next generation cannot run; the server ends with an error naming the
  // group rather than hanging.
  const std::vector<pid_t> followers = children_of(two.child.pid());
  ASSERT_EQ(followers.size(), 1u);
  ::kill(followers[0], SIGKILL);
  (void)generate(two.port);
  for (int i = 0; i < 300 && two.child.alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(two.child.alive());
  const std::string log = ServeProcess::read(two.log);
  EXPECT_NE(log.find("tensor-parallel engine group"), std::string::npos) << log;
  EXPECT_TRUE(one.child.alive());  // the single-process server is unaffected
}

// A port free on 127.0.0.1 right now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// An external launcher (Slurm, Kubernetes) starts the follower: rank 0 hosts the store at the
// address it was given and waits; `miles engine-tp-worker` joins it.
TEST(ServeTp, FollowerStartedElsewhereJoinsThroughTheStore) {
  const std::string store = "127.0.0.1:" + std::to_string(free_port());
  ServeProcess one;
  ASSERT_TRUE(one.start("ext_one", {}).ok());
  // Started first: it waits (retrying, up to its timeout) for rank 0's store to come up.
  auto worker = controller::ChildProcess::spawn(
      {test::binary_dir() + "/bin/miles", "engine-tp-worker", "--store", store, "--rank", "1",
       "--world", "2", "--threads", "1"},
      test::binary_dir() + "/engine_tp_ext_worker.log");
  ASSERT_TRUE(worker.ok()) << worker.message();
  ServeProcess two;
  const Status s =
      two.start("ext_two", {"--tp", "2", "--tp-launch", "external", "--tp-store", store});
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(children_of(two.child.pid()).empty());  // nothing started by rank 0
  const json a = generate(one.port), b = generate(two.port);
  ASSERT_TRUE(a.is_array() && b.is_array() && a.size() == b.size()) << b.dump();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i]["meta_info"]["output_token_logprobs"],
              b[i]["meta_info"]["output_token_logprobs"]);
  two.child.terminate();  // rank 0 stops: the follower is told to stop and exits cleanly
  for (int i = 0; i < 100 && worker->alive(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(worker->alive());
  EXPECT_EQ(worker->exit_description().find("signal"), std::string::npos)
      << worker->exit_description();
}

// Weight groups into `miles serve --tp 2` with engine_tp 2, both transports: the test is the
// trainer (one rank). p2p sends each engine rank only its shard; broadcast reaches every rank,
// which keeps its slice; rank 0 never relays a follower's shard. Afterwards the engine generates
// what a one-process engine brought to the same weights (engine_tp 1, whole tensors) generates, bit
// for bit, and reports per-shard checksums equal to the trainer's weights sliced the engine's way.
// A join whose engine_tp is not the engine's is refused; a transfer cut by the sender leaves
// version 1 serving, and the next version after a new join arrives whole.
struct GroupTrainer {
  std::string transport = "p2p";
  Result<ModelFiles> files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ThreadPool pool{1};
  std::unique_ptr<Trainer> trainer;
  TransferPlan plan;
  std::unique_ptr<TcpStoreServer> store;
  TensorSource source = [this](const std::string& n) { return trainer->params().get(n); };

  Status start() {
    MILES_RETURN_IF_ERROR(files.status());
    TrainerConfig tc;
    tc.lr.lr = 1e-2;
    MILES_ASSIGN_OR_RETURN(trainer, Trainer::create(files->config, files->weights, tc, &pool));
    MILES_ASSIGN_OR_RETURN(plan,
                           make_transfer_plan(files->config, *ParamLayout::for_model(files->config),
                                              ParallelLayout{}));
    MILES_ASSIGN_OR_RETURN(store, TcpStoreServer::start({}));
    return Status::Ok();
  }
  Status step() {
    TrainSample x;
    x.tokens = {1, 5, 9, 200, 31, 7, 8};
    x.response_length = 6;
    x.loss_mask.assign(6, 1.0f);
    std::vector<TrainSample> batch{x};
    return trainer->step(batch, sft_objective(batch, 6)).status();
  }
  json join(const std::string& prefix, int engine_tp) const {
    json j = {{"store", store->address()},
              {"prefix", prefix},
              {"rank", 1},
              {"world_size", 1 + engine_tp},
              {"timeout_s", 20},
              {"transport", transport},
              {"comm", comm},
              {"plan_digest", transfer_plan_digest(plan)}};
    if (transport == "p2p") j["trainer_layout"] = "dp=1,pp=1,tp=1";
    if (engine_tp > 1) j["engine_tp"] = engine_tp;
    return j;
  }
  Result<std::unique_ptr<Communicator>> connect(const std::string& prefix, int world) const {
    CommOptions o;
    o.rank = 0;
    o.world_size = world;
    o.store_address = store->address();
    o.prefix = prefix;
    o.timeout = std::chrono::seconds(20);
    return comm == "shm" ? connect_shm(o) : connect_gloo(o);
  }
  std::string comm = "gloo";  // the weight groups' communicator
};

json post(int port, const std::string& path, const json& body, int* status) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120);
  auto r = c.Post(path, body.dump(), "application/json");
  *status = r ? r->status : -1;
  return r ? json::parse(r->body, nullptr, false) : json();
}

// Joins `prefix` (engine_tp ranks), then sends `version` while the engine receives it; `cut`: the
// sender drops the group instead of sending. The update's HTTP status and reply.
std::pair<int, json> group_update(const GroupTrainer& t, int port, const std::string& prefix,
                                  int engine_tp, int64_t version, bool cut = false) {
  int status = 0;
  json j = post(port, "/join_weight_group", t.join(prefix, engine_tp), &status);
  if (status != 200) return {status, j};
  auto comm = t.connect(prefix, 1 + engine_tp);
  if (!comm.ok()) return {-1, json{{"message", comm.message()}}};
  auto update = std::async(std::launch::async, [&] {
    int st = 0;
    json r = post(port, "/update_weights_from_group", {{"weight_version", version}}, &st);
    return std::make_pair(st, r);
  });
  if (cut) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm->reset();
  } else {
    Status s = t.transport == "p2p" ? p2p_send_weights(**comm, t.plan, version, t.source,
                                                       P2pRoles{ParallelLayout{}, 1, engine_tp})
                                    : send_stage_weights(**comm, t.plan, 0, version, t.source);
    if (!s.ok()) return {-1, json{{"message", s.message()}}};
  }
  return update.get();
}

// The samples' tokens, logprobs, routed experts and weight versions (not their request ids).
json samples_of(const json& generated) {
  json out = json::array();
  if (!generated.is_array()) return out;
  for (const json& g : generated) {
    json m;
    for (const char* k : {"output_token_logprobs", "output_token_raw_logprobs", "routed_experts",
                          "output_token_weight_versions"})
      m[k] = g["meta_info"][k];
    out.push_back(m);
  }
  return out;
}

json checksums_of(int port) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/weight_checksums");
  return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
}

class ServeTpGroups : public ::testing::TestWithParam<const char*> {};

TEST_P(ServeTpGroups, EveryRankTakesItsShardStraightFromTheTrainer) {
  GroupTrainer t;
  t.transport = GetParam();
  ASSERT_TRUE(t.start().ok());
  ServeProcess one, two;
  ASSERT_TRUE(one.start(t.transport + "_one", {}).ok());
  Status s = two.start(t.transport + "_two", {"--tp", "2"});
  ASSERT_TRUE(s.ok()) << s.message();
  const json before = generate(two.port);

  int status = 0;
  json j = post(two.port, "/join_weight_group", t.join("bad", 3), &status);
  EXPECT_EQ(status, 400) << j.dump();
  EXPECT_NE(j["message"].get<std::string>().find("this engine has 2 tensor-parallel ranks"),
            std::string::npos)
      << j.dump();

  ASSERT_TRUE(t.step().ok());
  auto [st1, r1] = group_update(t, one.port, "whole-1", 1, 1);
  ASSERT_EQ(st1, 200) << r1.dump();
  auto [st2, r2] = group_update(t, two.port, "shards-1", 2, 1);
  ASSERT_EQ(st2, 200) << r2.dump();
  const json a = samples_of(generate(one.port)), b = samples_of(generate(two.port));
  ASSERT_EQ(b.size(), 4u);
  EXPECT_NE(b, samples_of(before)) << "the update changed nothing: the test cannot tell";
  EXPECT_EQ(a, b);
  const json held = checksums_of(two.port);
  EXPECT_EQ(held["weight_version"], 1);
  int sharded = 0;
  const auto layout = ParamLayout::for_model(t.files->config);
  for (const ParamSpec& p : layout->specs()) {
    const std::string want = sharded_checksum_of(p.name, p.shape, t.source(p.name), 2);
    EXPECT_EQ(held["checksums"][p.name], want) << p.name;
    sharded += want.rfind("tp2:", 0) == 0;
  }
  EXPECT_GT(sharded, 0);

  // A cut transfer: version 2 does not arrive, version 1 keeps serving; a new join brings v3.
  ASSERT_TRUE(t.step().ok());
  auto [st3, r3] = group_update(t, two.port, "shards-2", 2, 2, /*cut=*/true);
  EXPECT_EQ(st3, 400) << r3.dump();
  EXPECT_EQ(checksums_of(two.port)["weight_version"], 1);
  EXPECT_EQ(samples_of(generate(two.port)), b);
  // Version 3 over shared memory: the engine's followers are on its host (a local launch's group
  // is a shared-memory one), so they join it too.
  ASSERT_TRUE(t.step().ok());
  t.comm = "shm";
  auto [st4, r4] = group_update(t, two.port, "shards-3", 2, 3);
  ASSERT_EQ(st4, 200) << r4.dump();
  auto [st5, r5] = group_update(t, one.port, "whole-3", 1, 3);
  ASSERT_EQ(st5, 200) << r5.dump();
  const json c = samples_of(generate(two.port));
  EXPECT_EQ(c, samples_of(generate(one.port)));
  EXPECT_NE(c, b);
  EXPECT_EQ(checksums_of(two.port)["weight_version"], 3);

  // An engine whose followers meet over Gloo (they may be on other hosts) refuses a shared-memory
  // join, naming gloo.
  if (t.transport != "p2p") return;  // one instance is enough
  ServeProcess tcp;
  s = tcp.start("tcp_two", {"--tp", "2", "--tp-transport", "gloo"});
  ASSERT_TRUE(s.ok()) << s.message();
  json refused = post(tcp.port, "/join_weight_group", t.join("shards-tcp", 2), &status);
  EXPECT_EQ(status, 400) << refused.dump();
  EXPECT_NE(refused["message"].get<std::string>().find(
                "followers are not on its host (their group is not a shared-memory one): join "
                "over gloo"),
            std::string::npos)
      << refused.dump();
}

INSTANTIATE_TEST_SUITE_P(Transports, ServeTpGroups, ::testing::Values("p2p", "broadcast"));

TEST(ServeTp, ASizeThatDoesNotSplitIsRefusedNamingTheDimension) {
  ServeProcess three;
  const Status s = three.start("three", {"--tp", "3"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("num_attention_heads = 4 does not split over tp=3"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace miles
