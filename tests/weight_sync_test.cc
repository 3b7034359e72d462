// Weight sync over real processes: a trainer process takes an optimizer step and broadcasts the new
// version bucket by bucket (checksummed) to two engine processes, which swap it in and then
// generate exactly what an engine on the trainer's weights generates; a sender killed mid-transfer
// leaves the engines serving the previous version with an error; a flipped byte is caught before
// any swap.
#include "miles/weight_sync/weight_sync.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "miles/comm.h"
#include "miles/flat_params.h"
#include "miles/rollout/engine.h"
#include "miles/tensor_parallel.h"
#include "miles/thread_pool.h"
#include "miles/trainer/trainer.h"
#include "multiprocess.h"
#include "test_paths.h"

namespace miles {
namespace {

using testing::run_processes;
using testing::StoreProcess;

const std::string kModel = "llama";

// Greedy tokens and raw logprobs (as bits) of a fixed prompt, from an engine.
std::string generate(Engine& e) {
  GenerateRequest r;
  r.input_ids = {1, 17, 300, 42, 7};
  r.sampling.temperature = 0.0f;
  r.max_new_tokens = 6;
  r.ignore_eos = true;
  std::string out;
  auto id = e.submit(r, [&](const SampleEvent& ev) {
    if (!ev.finished) return;
    for (const TokenOutput& t : ev.output) {
      uint32_t bits;
      std::memcpy(&bits, &t.raw_logprob, 4);
      out += std::to_string(t.id) + ":" + std::to_string(bits) + " ";
    }
  });
  if (!id.ok()) return "submit failed: " + id.message();
  for (int i = 0; i < 1000 && !e.idle(); ++i) e.step();
  return out;
}

std::unique_ptr<Engine> engine_on(const ModelConfig& c, const TensorMap& w, ThreadPool* pool) {
  auto m = Model::from_weights(c, w);
  if (!m.ok()) return nullptr;
  return std::make_unique<Engine>(
      make_model_runner(std::shared_ptr<const Model>(std::move(*m)), pool),
      EngineOptions{.num_blocks = 64, .block_tokens = 8});
}

// Rank `rank` of a Gloo world of `world` ranks meeting at `store`.
Result<std::unique_ptr<Communicator>> join_world(int rank, int world, const std::string& store,
                                                 int timeout_ms, bool shm = false) {
  CommOptions co;
  co.rank = rank;
  co.world_size = world;
  co.store_address = store;
  co.timeout = std::chrono::milliseconds(timeout_ms);
  return shm ? connect_shm(co) : connect_gloo(co);
}

struct SyncSetup {
  ModelFiles files;
  TransferPlan plan;
};

SyncSetup setup(int64_t bucket_bytes) {
  SyncSetup s;
  auto f = load_model_files(test::data_dir() + "/models/" + kModel);
  if (!f.ok()) std::abort();
  s.files = std::move(*f);
  auto layout = ParamLayout::for_model(s.files.config, &s.files.weights);
  s.plan = *make_transfer_plan(s.files.config, *layout, ParallelLayout{},
                               {.bucket_bytes = bucket_bytes});
  return s;
}

// Rank 0: trainer (one SFT step, then sends version 1); ranks 1, 2: engines.
std::string run_rank(int rank, const std::string& store, int64_t bucket_bytes, int die_at_bucket,
                     bool shm = false) {
  SyncSetup s = setup(bucket_bytes);
  ThreadPool pool(1);
  auto comm = join_world(rank, 3, store, 5000, shm);
  if (!comm.ok()) return "error=" + comm.message();
  if (rank == 0) {
    auto tr = Trainer::create(s.files.config, s.files.weights, TrainerConfig{}, &pool);
    if (!tr.ok()) return "error=" + tr.message();
    TrainSample x;
    x.tokens = {1, 17, 300, 42, 7, 99, 512, 3};
    x.response_length = 7;
    x.loss_mask.assign(7, 1.0f);
    std::vector<TrainSample> batch{x};
    if (!(*tr)->step(batch, sft_objective(batch, 7)).ok()) return "error=step";
    std::map<std::string, size_t> bucket_of;
    for (size_t b = 0; b < s.plan.buckets.size(); ++b)
      for (const auto& t : s.plan.buckets[b].tensors) bucket_of[t.name] = b;
    TensorSource source = [&](const std::string& name) {
      if (die_at_bucket >= 0 && static_cast<int>(bucket_of[name]) == die_at_bucket) _exit(9);
      return (*tr)->params().get(name);
    };
    Status st = make_broadcast_sender(**comm, s.plan)->send(1, source);
    const TensorMap view = (*tr)->params().as_tensor_map();
    auto e = engine_on(s.files.config, view, &pool);
    return "status=" + std::string(st.ok() ? "ok" : st.message()) + "\ntokens=" + generate(*e);
  }
  auto e = engine_on(s.files.config, s.files.weights, &pool);
  const std::string before = generate(*e);
  auto set = make_broadcast_receiver(**comm, s.plan)->receive(1);
  Status st = set.status();
  if (st.ok()) st = apply_to_engine(*e, s.files.config, *set, s.plan, &pool);
  return "status=" + std::string(st.ok() ? "ok" : st.message()) + "\nbefore=" + before +
         "\ntokens=" + generate(*e) + "\nversion=" + std::to_string(e->stats().weight_version);
}

// Over TCP (gloo) and over shared memory (shm: the engines on the trainer's host).
class BroadcastOver : public ::testing::TestWithParam<bool> {};

TEST_P(BroadcastOver, ReachesEveryEngineBitForBit) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  const std::string addr = store.address();
  const bool shm = GetParam();
  auto results = run_processes(
      3, [&](int rank) { return run_rank(rank, addr, 40000, -1, shm); }, std::chrono::seconds(60));
  const auto trainer = results[0].fields();
  ASSERT_EQ(trainer.at("status"), "ok") << results[0].describe();
  for (int r = 1; r <= 2; ++r) {
    const auto f = results[r].fields();
    ASSERT_EQ(f.at("status"), "ok") << results[r].describe();
    EXPECT_EQ(f.at("version"), "1");
    EXPECT_EQ(f.at("tokens"), trainer.at("tokens"))
        << "engine " << r << " does not serve the new weights";
    EXPECT_NE(f.at("before"), f.at("tokens")) << "the update changed nothing: the test cannot tell";
  }
}

// The sender may pass checksums it already has (the controller's, from publishing): the headers
// carry them without a second pass over the weights, and a wrong one is caught by the receiver
// (naming the tensor) before anything is staged.
TEST(WeightSync, BroadcastTakesKnownChecksumsAndAWrongOneIsCaught) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  const std::string addr = store.address();
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        SyncSetup s = setup(40000);
        auto comm = join_world(rank, 2, addr, 5000);
        if (!comm.ok()) return "error=" + comm.message();
        const std::string wrong_name = s.plan.buckets.back().tensors.back().name;
        if (rank == 0) {
          auto flat = FlatTensors::from_tensor_map(
              ParamLayout::for_model(s.files.config, &s.files.weights), s.files.weights);
          if (!flat.ok()) return "error=" + flat.message();
          const TensorSource source = [&](const std::string& n) {
            return std::as_const(*flat).get(n);
          };
          int asked = 0;
          BroadcastOptions known;
          known.known_xxh3 = [&](const std::string& n) {
            ++asked;
            std::span<const float> v = source(n);
            return xxh3_128_hex(v.data(), v.size_bytes());
          };
          Status a = make_broadcast_sender(**comm, s.plan, known)->send(1, source);
          BroadcastOptions wrong;
          wrong.known_xxh3 = [&](const std::string& n) {
            return n == wrong_name ? std::string(32, '0') : std::string();
          };
          Status b = make_broadcast_sender(**comm, s.plan, wrong)->send(2, source);
          return "sent=" + std::string(a.ok() && b.ok() ? "ok" : a.message() + b.message()) +
                 "\nasked=" + std::to_string(asked);
        }
        auto v1 = make_broadcast_receiver(**comm, s.plan)->receive(1);
        auto v2 = make_broadcast_receiver(**comm, s.plan)->receive(2);
        Status first = v1.ok() ? verify_received_weights(*v1, s.plan) : v1.status();
        Status second = v2.ok() ? verify_received_weights(*v2, s.plan) : v2.status();
        return "first=" + std::string(first.ok() ? "ok" : first.message()) +
               "\nsecond=" + (second.ok() ? std::string("ok") : second.message()) +
               "\nwrong=" + wrong_name;
      },
      std::chrono::seconds(60));
  const auto sender = results[0].fields(), engine = results[1].fields();
  ASSERT_EQ(sender.at("sent"), "ok") << results[0].describe();
  size_t tensors = 0;
  for (const Bucket& b : setup(40000).plan.buckets) tensors += b.tensors.size();
  EXPECT_EQ(sender.at("asked"), std::to_string(tensors));
  EXPECT_EQ(engine.at("first"), "ok") << results[1].describe();
  EXPECT_NE(engine.at("second").find("checksum mismatch for " + engine.at("wrong")),
            std::string::npos)
      << results[1].describe();
}

TEST_P(BroadcastOver, ASenderKilledMidTransferLeavesEnginesOnTheOldVersion) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  const std::string addr = store.address();
  SyncSetup s = setup(40000);
  ASSERT_GT(s.plan.buckets.size(), 3u);
  const bool shm = GetParam();
  auto results = run_processes(
      3, [&](int rank) { return run_rank(rank, addr, 40000, 2, shm); }, std::chrono::seconds(60));
  EXPECT_FALSE(results[0].exited && results[0].exit_code == 0);
  for (int r = 1; r <= 2; ++r) {
    const auto f = results[r].fields();
    ASSERT_TRUE(f.count("status")) << results[r].describe();
    EXPECT_NE(f.at("status"), "ok");
    EXPECT_NE(f.at("status").find("bucket 2"), std::string::npos) << f.at("status");
    EXPECT_EQ(f.at("version"), "0");
    EXPECT_EQ(f.at("tokens"), f.at("before")) << "engine " << r << " must still serve version 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, BroadcastOver, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

// P2P: trainer ranks in a tp / pp layout send their own shards to two engines. With engine_tp 1
// each engine assembles the whole version and generates; with engine_tp > 1 every engine rank
// receives only its own shard (printed as its checksums, which the test compares with the
// trainer's weights sliced the engine's way).
std::string shard_sums(const ReceivedWeights& set) {
  std::string out;
  for (const auto& [name, sum] : set.checksums) out += name + ":" + sum + " ";
  return out;
}

// "shard<j>=" lines: each of `engine_tp` engine ranks' shard checksums of `full`, cut by
// tensor_parallel::slice.
std::string expected_shards(const ModelConfig& config, const FlatTensors& full, int engine_tp) {
  std::string out;
  FlatTensors shard(ParamLayout::for_model(*tensor_parallel::local_config(config, engine_tp)));
  for (int j = 0; j < engine_tp; ++j) {
    tensor_parallel::slice(full, shard, j, engine_tp);
    ReceivedWeights want;
    for (const ParamSpec& p : shard.layout().specs()) {
      std::span<const float> v = std::as_const(shard).get(p.name);
      want.checksums[p.name] = xxh3_128_hex(v.data(), v.size_bytes());
    }
    out += "\nshard" + std::to_string(j) + "=" + shard_sums(want);
  }
  return out;
}

std::string run_p2p_rank(int rank, const std::string& store, const std::string& spec,
                         int engine_tp) {
  const ParallelLayout layout = *ParallelLayout::parse(spec);
  const int trainers = layout.world_size();
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  if (!files.ok()) return "status=" + files.message();
  const auto full_layout = ParamLayout::for_model(files->config, &files->weights);
  auto plan = make_transfer_plan(files->config, *full_layout, layout, {.bucket_bytes = 30000});
  if (!plan.ok()) return "status=" + plan.message();
  const P2pRoles roles{layout, 2, engine_tp};
  ThreadPool pool(1);
  auto world = join_world(rank, roles.world_size(), store, 10000);
  if (!world.ok()) return "status=" + world.message();
  if (rank >= trainers) {
    ReceivedWeights set;
    if (engine_tp > 1) {
      Status st = p2p_receive_weights(**world, *plan, 1, roles, &set);
      int64_t floats = 0;
      for (const auto& [name, v] : set.tensors) floats += static_cast<int64_t>(v.size());
      return "status=" + std::string(st.ok() ? "ok" : st.message()) + "\nsums=" + shard_sums(set) +
             "\nfloats=" + std::to_string(floats);
    }
    auto e = engine_on(files->config, files->weights, &pool);
    const std::string before = generate(*e);
    Status st = p2p_receive_weights(**world, *plan, 1, roles, &set);
    if (st.ok()) st = apply_to_engine(*e, files->config, set, *plan, &pool);
    return "status=" + std::string(st.ok() ? "ok" : st.message()) + "\nbefore=" + before +
           "\ntokens=" + generate(*e);
  }
  std::vector<int> members;
  for (int r = 0; r < trainers; ++r) members.push_back(r);
  auto tworld = (*world)->new_group(members, "trainer");
  if (!tworld.ok()) return "status=" + tworld.message();
  auto groups = make_parallel_groups(**tworld, layout);
  if (!groups.ok()) return "status=" + groups.message();
  TrainerConfig tc;
  tc.lr.lr = 1e-2;
  auto tr = Trainer::create(files->config, files->weights, tc, &pool);
  if (!tr.ok()) return "status=" + tr.message();
  if (layout.pp() > 1 && !(*tr)->set_pipeline_stage(groups->coord.pp, layout.pp()).ok())
    return "status=stage";
  if (layout.tp() > 1 && !(*tr)->shard_for_tensor_parallel(*groups->tp).ok()) return "status=shard";
  TrainSample x;
  x.tokens = {1, 17, 300, 42, 7, 99, 512, 3};
  x.response_length = 7;
  x.loss_mask.assign(7, 1.0f);
  std::vector<TrainSample> batch{x, x};
  auto r = (*tr)->step(batch, sft_objective(batch, 14), {groups->dp.get(), groups->pp.get()});
  if (!r.ok()) return "status=" + r.message();
  Status st = p2p_send_weights(
      **world, *plan, 1, [&](const std::string& n) { return (*tr)->params().get(n); }, roles);
  if (!st.ok()) return "status=" + st.message();
  // The reference: the whole model gathered on every trainer rank.
  if (groups->pp && !(*tr)->gather_pipeline_state(*groups->pp).ok()) return "status=gather pp";
  std::unique_ptr<Trainer> full;
  if (layout.tp() > 1) {
    auto g = (*tr)->gather_tensor_parallel(*groups->tp);
    if (!g.ok()) return "status=" + g.message();
    full = std::move(*g);
  }
  const FlatTensors& params = (full ? *full : **tr).params();
  if (engine_tp > 1) {
    return "status=ok" + expected_shards(files->config, params, engine_tp);
  }
  auto e = engine_on(files->config, params.as_tensor_map(), &pool);
  return "status=ok\ntokens=" + generate(*e);
}

// A wire that flips one bit of the `nth` message of at least 1 KiB this rank sends (a piece:
// versions and checksum trailers are smaller), after the sender has read the bytes it hashes:
// what a bad link or a bug in a transport would do. Everything else goes to `inner` unchanged.
class CorruptingWire : public Communicator {
 public:
  CorruptingWire(Communicator& inner, int nth) : inner_(inner), nth_(nth) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::vector<int>& world_ranks() const override { return inner_.world_ranks(); }
  const std::string& name() const override { return inner_.name(); }
  Status barrier() override { return inner_.barrier(); }
  Status broadcast(void* data, size_t bytes, int root) override {
    return inner_.broadcast(data, bytes, root);
  }
  Status allgather(const void* in, size_t bytes, void* out) override {
    return inner_.allgather(in, bytes, out);
  }
  Status send(const void* data, size_t bytes, int dst, uint32_t tag) override {
    if (bytes < 1024 || seen_.fetch_add(1) != nth_) return inner_.send(data, bytes, dst, tag);
    std::vector<char> flipped(static_cast<const char*>(data),
                              static_cast<const char*>(data) + bytes);
    flipped[bytes / 2] ^= 0x10;
    return inner_.send(flipped.data(), bytes, dst, tag);
  }
  Status recv(void* data, size_t bytes, int src, uint32_t tag) override {
    return inner_.recv(data, bytes, src, tag);
  }
  Result<std::unique_ptr<Communicator>> new_group(std::span<const int> ranks,
                                                  std::string_view label) override {
    return inner_.new_group(ranks, label);
  }

 private:
  Communicator& inner_;
  const int nth_;
  std::atomic<int> seen_{0};
};

// p2p checks every piece against the sender's checksum as it lands: a bit flipped on the wire in
// a piece (one that lands straight in the engine's tensor, or a column split staged on the way)
// fails the receive with the tensor's name, and the engine keeps its weights. The same transfer
// without the flip is taken.
TEST(WeightSync, P2pCatchesAPieceCorruptedOnTheWire) {
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  ASSERT_TRUE(files.ok()) << files.message();
  // The nth piece trainer rank 0 sends, and its tensor: one that lands straight in the engine's
  // tensor (the embedding), a column split staged on the way (o_proj), the last bucket's.
  const std::vector<std::pair<int, std::string>> cases = {
      {-1, ""},
      {0, "model.embed_tokens.weight"},
      {4, "model.layers.0.self_attn.o_proj.weight"},
      {11, "lm_head.weight"}};
  for (const auto& [nth, tensor] : cases) {
    StoreProcess store;
    ASSERT_TRUE(store.ok());
    const std::string addr = store.address();
    auto results = run_processes(
        3,  // trainer ranks 0-1 (tp = 2), one engine
        [&](int rank) -> std::string {
          const ParallelLayout layout = *ParallelLayout::parse("tp=2");
          const auto full_layout = ParamLayout::for_model(files->config, &files->weights);
          auto plan =
              make_transfer_plan(files->config, *full_layout, layout, {.bucket_bytes = 30000});
          if (!plan.ok()) return "status=" + plan.message();
          const P2pRoles roles{layout, 1, 1};
          auto world = join_world(rank, roles.world_size(), addr, 10000);
          if (!world.ok()) return "status=" + world.message();
          if (rank == 2) {
            ThreadPool pool(1);
            auto e = engine_on(files->config, files->weights, &pool);
            const std::string before = generate(*e);
            ReceivedWeights set;
            Status st = p2p_receive_weights(**world, *plan, 1, roles, &set);
            if (st.ok()) st = apply_to_engine(*e, files->config, set, *plan, &pool);
            return "status=" + std::string(st.ok() ? "ok" : st.message()) +
                   "\nkept=" + (generate(*e) == before ? "yes" : "no");
          }
          // This trainer rank's tensor-parallel shard of the weights doubled, so that the
          // engine's tokens tell an applied version from the old one.
          auto whole = FlatTensors::from_tensor_map(full_layout, files->weights);
          if (!whole.ok()) return "status=" + whole.message();
          for (float& x : whole->all()) x *= 2.0f;
          FlatTensors shard(
              ParamLayout::for_model(*tensor_parallel::local_config(files->config, 2)));
          tensor_parallel::slice(*whole, shard, rank, 2);
          CorruptingWire wire(**world, rank == 0 ? nth : -1);
          Status st = p2p_send_weights(
              wire, *plan, 1, [&](const std::string& n) { return std::as_const(shard).get(n); },
              roles);
          return "status=" + std::string(st.ok() ? "ok" : st.message());
        },
        std::chrono::seconds(90));
    const auto engine = results[2].fields();
    if (nth < 0) {  // (after a mismatch the engine stops listening: the senders may see it)
      for (int r = 0; r < 2; ++r)
        EXPECT_EQ(results[r].fields().at("status"), "ok") << results[r].describe();
      EXPECT_EQ(engine.at("status"), "ok") << results[2].describe();
      EXPECT_EQ(engine.at("kept"), "no")
          << "the clean transfer changed nothing: the test cannot tell";
    } else {
      const std::string want = "checksum mismatch for " + tensor + " (piece from trainer rank 0)";
      EXPECT_NE(engine.at("status").find(want), std::string::npos)
          << nth << ": " << results[2].describe();
      EXPECT_EQ(engine.at("kept"), "yes") << nth;
    }
  }
}

TEST(WeightSync, P2pShardsFromEveryTrainerRankAssembleOnTheEngines) {
  for (const char* spec : {"tp=2", "pp=2,tp=2", "dp=2"}) {
    StoreProcess store;
    ASSERT_TRUE(store.ok());
    const std::string addr = store.address();
    const int trainers = ParallelLayout::parse(spec)->world_size();
    auto results = run_processes(
        trainers + 2, [&](int rank) { return run_p2p_rank(rank, addr, spec, 1); },
        std::chrono::seconds(90));
    const auto ref = results[0].fields();
    ASSERT_EQ(ref.at("status"), "ok") << spec << ": " << results[0].describe();
    for (int e = trainers; e < trainers + 2; ++e) {
      const auto f = results[e].fields();
      ASSERT_EQ(f.at("status"), "ok") << spec << ": " << results[e].describe();
      EXPECT_EQ(f.at("tokens"), ref.at("tokens")) << spec << " engine " << e;
      EXPECT_NE(f.at("tokens"), f.at("before"))
          << "the update changed nothing: the test cannot tell";
    }
  }
}

// Two engines of two tensor-parallel ranks each: every engine rank gets exactly its own shard,
// straight from the trainer ranks, whatever the trainer's tensor-parallel size (1: each trainer
// rank's tensor splits over both engine ranks; 2: the splits line up).
TEST(WeightSync, P2pSendsEachTensorParallelEngineRankItsShard) {
  for (const char* spec : {"tp=2", "pp=2,tp=2", "dp=2", "pp=2"}) {
    StoreProcess store;
    ASSERT_TRUE(store.ok());
    const std::string addr = store.address();
    const int trainers = ParallelLayout::parse(spec)->world_size();
    auto results = run_processes(
        trainers + 4, [&](int rank) { return run_p2p_rank(rank, addr, spec, 2); },
        std::chrono::seconds(90));
    const auto ref = results[0].fields();
    ASSERT_EQ(ref.at("status"), "ok") << spec << ": " << results[0].describe();
    ASSERT_NE(ref.at("shard0"), ref.at("shard1"));
    for (int e = 0; e < 2; ++e)
      for (int j = 0; j < 2; ++j) {
        const auto f = results[trainers + e * 2 + j].fields();
        ASSERT_EQ(f.at("status"), "ok") << spec << ": " << results[trainers + e * 2 + j].describe();
        EXPECT_EQ(f.at("sums"), ref.at("shard" + std::to_string(j)))
            << spec << " engine " << e << " rank " << j;
      }
  }
}

// Broadcast into tensor-parallel engines: two engines of two ranks each are members of the group;
// every rank checks each whole tensor as its bucket arrives and keeps only its shard. A sender
// whose header lies about one tensor's checksum fails every rank, naming the tensor.
std::string run_shard_broadcast_rank(int rank, const std::string& store, bool lie) {
  auto files = load_model_files(test::data_dir() + "/models/qwen3_moe");
  if (!files.ok()) return "status=" + files.message();
  const auto layout = ParamLayout::for_model(files->config, &files->weights);
  auto plan = make_transfer_plan(files->config, *layout, ParallelLayout{}, {.bucket_bytes = 30000});
  if (!plan.ok()) return "status=" + plan.message();
  auto full = FlatTensors::from_tensor_map(layout, files->weights);
  if (!full.ok()) return "status=" + full.message();
  auto comm = join_world(rank, 5, store, 10000);
  if (!comm.ok()) return "status=" + comm.message();
  if (rank == 0) {
    BroadcastOptions bo;
    if (lie)
      bo.known_xxh3 = [](const std::string& n) {
        return n == "model.layers.1.mlp.experts.3.up_proj.weight" ? std::string(32, 'a') : "";
      };
    const TensorSource source = [&](const std::string& n) { return std::as_const(*full).get(n); };
    Status st = broadcast_weights(**comm, *plan, 1, source, nullptr, bo);
    return "status=" + std::string(st.ok() ? "ok" : st.message()) +
           expected_shards(files->config, *full, 2);
  }
  BroadcastOptions bo;
  bo.shard_rank = (rank - 1) % 2;
  bo.shard_size = 2;
  ReceivedWeights set;
  Status st = broadcast_weights(**comm, *plan, 1, {}, &set, bo);
  return "status=" + std::string(st.ok() ? "ok" : st.message()) + "\nsums=" + shard_sums(set);
}

TEST(WeightSync, BroadcastReceiversKeepTheirTensorParallelShard) {
  for (bool lie : {false, true}) {
    StoreProcess store;
    ASSERT_TRUE(store.ok());
    const std::string addr = store.address();
    auto results = run_processes(
        5, [&](int rank) { return run_shard_broadcast_rank(rank, addr, lie); },
        std::chrono::seconds(60));
    const auto ref = results[0].fields();
    // Receivers that found the lie leave, so the sender's later buckets fail too.
    if (!lie) {
      ASSERT_EQ(ref.at("status"), "ok") << results[0].describe();
    }
    for (int r = 1; r < 5; ++r) {
      const auto f = results[r].fields();
      if (lie) {
        EXPECT_NE(f.at("status").find("checksum mismatch for model.layers.1.mlp.experts.3.up_proj"),
                  std::string::npos)
            << results[r].describe();
        continue;
      }
      ASSERT_EQ(f.at("status"), "ok") << results[r].describe();
      EXPECT_EQ(f.at("sums"), ref.at("shard" + std::to_string((r - 1) % 2))) << "rank " << r;
    }
  }
}

// A trainer that publishes each optimizer step as the next version of a disk-delta directory.
struct DeltaPublisher {
  DeltaPublisher(const SyncSetup& s, ThreadPool* pool, const std::string& name)
      : dir(test::binary_dir() + "/" + name) {
    std::filesystem::remove_all(dir);
    TrainerConfig tc;
    tc.lr.lr = 1e-2;
    auto made = Trainer::create(s.files.config, s.files.weights, tc, pool);
    MILES_CHECK(made.ok());
    trainer = std::move(*made);
    sender = make_disk_delta_sender(dir, s.plan);
    TrainSample x;
    x.tokens = {1, 17, 300, 42, 7, 99, 512, 3};
    x.response_length = 7;
    x.loss_mask.assign(7, 1.0f);
    batch = {x};
  }
  Status publish(int64_t v) {
    MILES_RETURN_IF_ERROR(trainer->step(batch, sft_objective(batch, 7)).status());
    return sender->send(v, source);
  }
  std::string dir;
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<WeightSender> sender;
  std::vector<TrainSample> batch;
  const TensorSource source = [this](const std::string& n) { return trainer->params().get(n); };
};

// The one interface over disk-delta: a trainer publishes three optimizer steps; an engine following
// every version and one joining at the last both serve exactly the trainer's weights.
TEST(WeightSync, DiskDeltaThroughTheSenderReceiverInterface) {
  SyncSetup s = setup(40000);
  ThreadPool pool(1);
  DeltaPublisher pub(s, &pool, "weight_sync_delta");
  auto follower = make_disk_delta_receiver(pub.dir, s.plan);
  auto engine = engine_on(s.files.config, s.files.weights, &pool);
  const TensorSource& source = pub.source;
  std::string prev = generate(*engine);
  for (int64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(pub.publish(v).ok());
    auto got = follower->receive(v);
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_TRUE(check_weights(got->checksums, s.plan, source).ok());
    ASSERT_TRUE(apply_to_engine(*engine, s.files.config, *got, s.plan, &pool).ok());
    const TensorMap view = pub.trainer->params().as_tensor_map();
    auto reference = engine_on(s.files.config, view, &pool);
    const std::string now = generate(*engine);
    EXPECT_EQ(now, generate(*reference)) << "version " << v;
    EXPECT_EQ(engine->stats().weight_version, v);
    prev = now;
  }
  auto late = make_disk_delta_receiver(pub.dir, s.plan)->receive(3);
  ASSERT_TRUE(late.ok()) << late.message();
  EXPECT_TRUE(check_weights(late->checksums, s.plan, source).ok());
}

// The disk-delta receiver lends its current set (the base of its next delta) instead of copying
// it; a set still lent when the next version comes is copied first and keeps its bytes.
TEST(WeightSync, DiskDeltaReceiverLendsItsSetAndCopiesOneStillLent) {
  SyncSetup s = setup(40000);
  ThreadPool pool(1);
  DeltaPublisher pub(s, &pool, "weight_sync_delta_lent");
  auto rx = make_disk_delta_receiver(pub.dir, s.plan);
  const TensorSource& source = pub.source;
  // Every lent tensor still hashes to its checksum (the bytes the set was verified with).
  const auto intact = [&](const ReceivedWeights& w) {
    for (const auto& [name, values] : w.lent)
      if (xxh3_128_hex(values.data(), values.size_bytes()) != w.checksums.at(name)) return false;
    return true;
  };
  const size_t n = s.plan.tensor_names().size();
  ASSERT_TRUE(pub.publish(1).ok());
  auto v1 = rx->receive(1);
  ASSERT_TRUE(v1.ok()) << v1.message();
  EXPECT_TRUE(v1->tensors.empty());
  EXPECT_EQ(v1->lent.size(), n);
  EXPECT_TRUE(check_weights(v1->checksums, s.plan, source).ok());
  ASSERT_TRUE(pub.publish(2).ok());
  auto v2 = rx->receive(2);  // v1 is still held: the receiver advances a copy
  ASSERT_TRUE(v2.ok()) << v2.message();
  EXPECT_NE(v2->lent_owner.get(), v1->lent_owner.get());
  EXPECT_TRUE(intact(*v1));
  EXPECT_NE(v1->checksums, v2->checksums);
  EXPECT_TRUE(check_weights(v2->checksums, s.plan, source).ok());
  EXPECT_TRUE(intact(*v2));
  auto engine = engine_on(s.files.config, s.files.weights, &pool);
  ASSERT_TRUE(apply_to_engine(*engine, s.files.config, *v2, s.plan, &pool).ok());
  auto reference = engine_on(s.files.config, pub.trainer->params().as_tensor_map(), &pool);
  EXPECT_EQ(generate(*engine), generate(*reference));
  const void* set2 = v2->lent_owner.get();
  *v1 = ReceivedWeights{};  // the engine's model is built: the lent sets are let go
  *v2 = ReceivedWeights{};
  ASSERT_TRUE(pub.publish(3).ok());
  auto v3 = rx->receive(3);  // nothing holds v2 now: advanced in place, no copy
  ASSERT_TRUE(v3.ok()) << v3.message();
  EXPECT_EQ(v3->lent_owner.get(), set2);
  EXPECT_TRUE(check_weights(v3->checksums, s.plan, source).ok());
  EXPECT_TRUE(intact(*v3));
  // A lent set that was not verified on arrival is hashed again, and a changed byte is caught.
  ReceivedWeights copy = *v3;
  copy.verified = false;
  EXPECT_TRUE(verify_received_weights(copy, s.plan).ok());
  std::vector<float> changed(copy.lent.begin()->second.begin(), copy.lent.begin()->second.end());
  changed[0] = std::nextafter(changed[0], 1.0f);
  copy.lent.begin()->second = changed;
  EXPECT_NE(verify_received_weights(copy, s.plan).message().find("checksum mismatch"),
            std::string::npos);
}

TEST(WeightSync, AFlippedByteIsCaughtBeforeTheSwap) {
  SyncSetup s = setup(40000);
  ThreadPool pool(1);
  ReceivedWeights set;
  set.version = 3;
  const auto layout = ParamLayout::for_model(s.files.config, &s.files.weights);
  for (const ParamSpec& p : layout->specs()) {
    set.tensors[p.name] = s.files.weights.find(p.name)->to_f32();
    set.shapes[p.name] = p.shape;
    set.checksums[p.name] = xxh3_128_hex(set.tensors[p.name].data(), p.numel * 4);
  }
  EXPECT_TRUE(verify_received_weights(set, s.plan).ok());
  TensorSource trainer = [&](const std::string& n) {
    return std::span<const float>(set.tensors.at(n));
  };
  EXPECT_TRUE(check_weights(set.checksums, s.plan, trainer).ok());
  auto e = engine_on(s.files.config, s.files.weights, &pool);
  const std::string before = generate(*e);
  uint32_t bits;
  float& x = set.tensors["model.layers.1.mlp.down_proj.weight"][5];
  std::memcpy(&bits, &x, 4);
  bits ^= 1u << 3;
  std::memcpy(&x, &bits, 4);
  EXPECT_NE(check_weights(set.checksums, s.plan, trainer).message().find("1 of 21 tensors differ"),
            std::string::npos)
      << check_weights(set.checksums, s.plan, trainer).message();
  Status st = apply_to_engine(*e, s.files.config, set, s.plan, &pool);
  EXPECT_NE(st.message().find("checksum mismatch for model.layers.1.mlp.down_proj.weight"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(e->stats().weight_version, 0);
  EXPECT_EQ(generate(*e), before);
  bits ^= 1u << 3;  // restore, then lose a tensor instead
  std::memcpy(&x, &bits, 4);
  EXPECT_TRUE(verify_received_weights(set, s.plan).ok());
  set.tensors.erase("model.norm.weight");
  EXPECT_NE(verify_received_weights(set, s.plan).message().find("never arrived"),
            std::string::npos);
}

}  // namespace
}  // namespace miles
