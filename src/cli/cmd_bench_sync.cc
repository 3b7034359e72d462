// `miles bench sync`: time and bandwidth of a weight version's transfer per transport, between real
// processes on this machine (one sender, `--engines` receivers that verify every checksum), as a
// fraction of the memcpy bandwidth measured in the same run. The workers are `miles bench
// sync-worker` processes meeting through a TCP store hosted here.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/worker_launch.h"
#include "miles/comm.h"
#include "miles/model.h"
#include "miles/tcp_store.h"
#include "miles/weight_sync.h"

namespace miles::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct SyncOptions {
  std::string model, transports = "broadcast,p2p", out, role, store, transport;
  int64_t synthetic_mb = 0, bucket_mb = 512;
  int engines = 1, repeats = 3, rank = 0;
};

// A ~N MB Llama-shaped model config (hidden 1024, intermediate 4096, vocab 32000), layers to fit.
ModelConfig synthetic_config(int64_t mb) {
  ModelConfig c;
  c.arch_name = "LlamaForCausalLM";
  c.vocab_size = 32000;
  c.hidden_size = 1024;
  c.intermediate_size = 4096;
  c.num_heads = 16;
  c.num_kv_heads = 16;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  const int64_t per_layer = (4 * 1024 * 1024 + 3 * 4096 * 1024) * 4;
  const int64_t fixed = 2 * 32000 * 1024 * 4;
  c.num_layers = std::max<int64_t>(1, (mb * (1 << 20) - fixed) / per_layer);
  return c;
}

struct Weights {
  ModelConfig config;
  std::shared_ptr<const ParamLayout> layout;
  FlatTensors values;
};

Result<Weights> load_weights(const SyncOptions& o) {
  Weights w;
  if (o.synthetic_mb > 0) {
    w.config = synthetic_config(o.synthetic_mb);
    w.layout = ParamLayout::for_model(w.config);
    w.values = FlatTensors(w.layout);
    std::mt19937 rng(1);
    for (float& x : w.values.all()) x = static_cast<float>(rng() % 1000) * 1e-3f;
    return w;
  }
  MILES_ASSIGN_OR_RETURN(ModelFiles f, load_model_files(o.model));
  w.config = f.config;
  w.layout = ParamLayout::for_model(f.config, &f.weights);
  MILES_ASSIGN_OR_RETURN(w.values, FlatTensors::from_tensor_map(w.layout, f.weights));
  return w;
}

double memcpy_gbps() {
  std::vector<char> a(256 << 20, 1), b(256 << 20);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), a.size());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return a.size() / best / 1e9;
}

// One process of the measurement: rank 0 sends, the others receive (and verify) each repeat.
Status run_worker(const SyncOptions& o) {
  MILES_ASSIGN_OR_RETURN(Weights w, load_weights(o));
  MILES_ASSIGN_OR_RETURN(TransferPlan plan,
                         make_transfer_plan(w.config, *w.layout, ParallelLayout{},
                                            {.bucket_bytes = o.bucket_mb << 20}));
  CommOptions co;
  co.rank = o.rank;
  co.world_size = 1 + o.engines;
  co.store_address = o.store;
  co.prefix = "bench-sync-" + o.transport;
  co.timeout = std::chrono::milliseconds(600'000);
  MILES_ASSIGN_OR_RETURN(auto comm, connect_gloo(co));
  const TensorSource source = [&](const std::string& n) { return std::as_const(w.values).get(n); };
  const P2pRoles roles{ParallelLayout{}, o.engines};
  double best = 1e30;
  for (int r = 0; r < o.repeats; ++r) {
    MILES_RETURN_IF_ERROR(comm->barrier());
    const auto t0 = Clock::now();
    ReceivedWeights got;
    if (o.transport == "broadcast") {
      MILES_RETURN_IF_ERROR(
          broadcast_weights(*comm, plan, r + 1, o.rank == 0 ? source : nullptr, o.rank ? &got : nullptr));
    } else if (o.transport == "p2p") {
      if (o.rank == 0) {
        MILES_RETURN_IF_ERROR(p2p_send_weights(*comm, plan, r + 1, source, roles));
      } else {
        MILES_RETURN_IF_ERROR(p2p_receive_weights(*comm, plan, r + 1, roles, &got));
      }
    } else {
      return Status::Error("unknown transport '" + o.transport + "' (broadcast, p2p)");
    }
    if (o.rank != 0) MILES_RETURN_IF_ERROR(verify_received_weights(got, plan));
    MILES_RETURN_IF_ERROR(comm->barrier());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (o.rank == 0) {
    nlohmann::json j{{"seconds", best}, {"bytes", plan.total_bytes}, {"buckets", plan.buckets.size()}};
    std::ofstream(o.out) << j.dump();
  }
  return Status::Ok();
}

int run_bench(const SyncOptions& o) {
  const double copy = memcpy_gbps();
  std::printf("memcpy (1 thread, 256 MB, best of 5): %.2f GB/s\n", copy);
  std::printf("| transport | weights | MB | buckets | engines | seconds | GB/s | / memcpy |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::string list = o.transports + ",";
  for (size_t pos = 0, next; (next = list.find(',', pos)) != std::string::npos; pos = next + 1) {
    const std::string t = list.substr(pos, next - pos);
    if (t.empty()) continue;
    auto store = TcpStoreServer::start({});
    if (!store.ok()) return fail("bench sync", store.message());
    const std::string out = "/tmp/miles-bench-sync-" + std::to_string(getpid()) + ".json";
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r <= o.engines; ++r) {
      std::vector<std::string> a{self_executable(), "bench", "sync-worker", "--rank", std::to_string(r),
                                 "--engines", std::to_string(o.engines), "--store", (*store)->address(),
                                 "--transport", t, "--repeats", std::to_string(o.repeats),
                                 "--bucket-mb", std::to_string(o.bucket_mb), "--out", out};
      if (o.synthetic_mb > 0) {
        a.insert(a.end(), {"--synthetic-mb", std::to_string(o.synthetic_mb)});
      } else {
        a.insert(a.end(), {"--model", o.model});
      }
      argvs.push_back(std::move(a));
    }
    if (Status s = run_local_workers(o.engines + 1, argvs); !s.ok()) return fail("bench sync", s.message());
    std::ifstream in(out);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    std::remove(out.c_str());
    if (j.is_discarded()) return fail("bench sync", "no result from the sender");
    const double secs = j["seconds"].get<double>(), bytes = j["bytes"].get<double>();
    const double gbps = bytes * o.engines / secs / 1e9;  // bytes delivered
    std::printf("| %s | %s | %.1f | %lld | %d | %.4f | %.2f | %.2f |\n", t.c_str(),
                o.synthetic_mb > 0 ? ("synthetic " + std::to_string(o.synthetic_mb) + " MB").c_str()
                                   : o.model.c_str(),
                bytes / (1 << 20), static_cast<long long>(j["buckets"].get<int64_t>()), o.engines, secs,
                gbps, gbps / copy);
  }
  std::printf("GB/s counts the bytes delivered to all engines; each receiver verifies every xxh3-128.\n");
  return 0;
}

void add_common(CLI::App* s, SyncOptions* o) {
  s->add_option("--model", o->model, "HF directory or llama2.c checkpoint");
  s->add_option("--synthetic-mb", o->synthetic_mb, "a random Llama-shaped model of about N MB instead");
  s->add_option("--engines", o->engines, "receiving processes");
  s->add_option("--repeats", o->repeats, "transfers; the fastest counts");
  s->add_option("--bucket-mb", o->bucket_mb, "bucket size");
}

}  // namespace

void register_bench_sync(CLI::App& bench) {
  auto o = std::make_shared<SyncOptions>();
  CLI::App* s = bench.add_subcommand("sync", "Weight transfer time and bandwidth per transport");
  add_common(s, o.get());
  s->add_option("--transport", o->transports, "comma-separated: broadcast,p2p");
  s->callback([o] {
    if (o->model.empty() && o->synthetic_mb <= 0) std::exit(fail("bench sync", "--model or --synthetic-mb"));
    if (int rc = run_bench(*o); rc != 0) std::exit(rc);
  });
  auto w = std::make_shared<SyncOptions>();
  CLI::App* wk = bench.add_subcommand("sync-worker", "one process of `miles bench sync` (internal)");
  add_common(wk, w.get());
  wk->add_option("--rank", w->rank);
  wk->add_option("--store", w->store);
  wk->add_option("--transport", w->transport);
  wk->add_option("--out", w->out);
  wk->group("");  // hidden
  wk->callback([w] {
    if (Status st = run_worker(*w); !st.ok()) std::exit(fail("bench sync-worker", st.message()));
  });
}

}  // namespace miles::cli
