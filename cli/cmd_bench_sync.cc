// `miles bench sync`: time and bandwidth of a weight version's transfer per transport, between real
// processes on this machine (one sender, `--engines` receivers that verify every checksum), as a
// fraction of the memcpy bandwidth measured in the same run. The workers are `miles bench
// sync-worker` processes meeting through a TCP store hosted here.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "cli/model_files.h"
#include "cli/worker_launch.h"
#include "miles/comm.h"
#include "miles/controller/child_process.h"
#include "miles/model.h"
#include "miles/tcp_store.h"
#include "miles/tensor_parallel.h"
#include "miles/trainer/rl_objective.h"
#include "miles/trainer/trainer.h"
#include "miles/weight_sync/disk_delta.h"
#include "miles/weight_sync/weight_sync.h"

namespace miles::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct SyncOptions {
  std::string model, transports = "broadcast,p2p,disk-delta", out, role, store, transport;
  // The communicators the group transports run over: gloo (TCP, any hosts) and shm (shared
  // memory: engines on the sender's host).
  std::string comms = "gloo,shm", comm = "gloo";
  int64_t synthetic_mb = 0, bucket_mb = 512;
  int engines = 1, repeats = 3, rank = 0;
  // Tensor-parallel ranks per engine: p2p then sends each engine rank its own shard, broadcast
  // reaches every rank (each keeps its shard), or, for comparison, whole tensors go to each
  // engine's rank 0, which slices them and sends each follower its shard ("p2p-hop": what a
  // tensor-parallel engine does with whole tensors).
  int engine_tp = 1;
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

// xxh3-128 (xxh3_128_hex: the checksum every transport computes) of a 256 MB buffer that is not in
// cache, best of 5.
double xxh3_gbps() {
  std::vector<char> a(256 << 20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 2654435761u >> 13);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    const std::string h = xxh3_128_hex(a.data(), a.size());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    if (h.size() != 32) return 0;
  }
  return a.size() / best / 1e9;
}

// A plain TCP stream over loopback: 256 MB from one thread to another through a connected socket
// pair, written and read 4 MiB at a time, best of 3 — the limit a TCP transport (Gloo) has on this
// host. `whole`: from a 256 MB buffer into another (memory to memory, as a weight version moves,
// and as memcpy_gbps copies); else the same 4 MiB buffer on both sides (it stays in cache).
double tcp_stream_gbps(bool whole) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) ::close(listener);
    return 0;
  }
  const size_t total = size_t{256} << 20, piece = size_t{4} << 20;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const int out = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(out);
      break;
    }
    const int in = ::accept(listener, nullptr, nullptr);
    std::vector<char> src(whole ? total : piece, 3), dst(whole ? total : piece, 0);
    const auto t0 = Clock::now();
    std::thread reader([&] {
      for (size_t got = 0; got < total;) {
        const size_t at = whole ? got : 0;
        const ssize_t n = ::read(in, dst.data() + at, std::min(piece, dst.size() - at));
        if (n <= 0) return;
        got += static_cast<size_t>(n);
      }
    });
    for (size_t sent = 0; sent < total;) {
      const size_t at = whole ? sent : 0;
      const ssize_t n = ::write(out, src.data() + at, std::min(piece, total - sent));
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    reader.join();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    ::close(in);
    ::close(out);
  }
  ::close(listener);
  return best < 1e30 ? total / best / 1e9 : 0;
}

// `buf` written to `path` and fsynced; false when the file cannot be opened.
bool write_synced(const std::string& path, const std::vector<char>& buf) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  std::fwrite(buf.data(), 1, buf.size(), f);
  std::fflush(f);
  fsync(fileno(f));
  std::fclose(f);
  return true;
}

// Disk write bandwidth: 256 MB written and fsynced into `dir`, best of 3.
double disk_write_mbps(const std::string& dir) {
  std::vector<char> buf(256 << 20, 7);
  double best = 1e30;
  const std::string path = dir + "/bandwidth.bin";
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    if (!write_synced(path, buf)) return 0;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::remove(path.c_str());
  return buf.size() / best / 1e6;
}

// Disk read bandwidth: a 256 MB file written, fsynced and dropped from the page cache
// (POSIX_FADV_DONTNEED: a hint; a kernel that keeps the pages makes this the page cache's speed),
// then read back, best of 3; 0 when the file cannot be written.
double disk_read_mbps(const std::string& dir) {
  const std::string path = dir + "/read_bandwidth.bin";
  std::vector<char> buf(256 << 20, 5);
  if (!write_synced(path, buf)) return 0;
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) break;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const auto t0 = Clock::now();
    size_t got = 0;
    for (ssize_t n; (n = ::read(fd, buf.data() + got, buf.size() - got)) > 0;) got += n;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    ::close(fd);
  }
  std::remove(path.c_str());
  return best < 1e30 ? buf.size() / best / 1e6 : 0;
}

WeightSet weight_set_of(const FlatTensors& values) {
  return weight_set_from_tensor_map(values.as_tensor_map());
}

// One real RL optimizer step on the weights (PPO-clip GRPO loss on random rollouts of the model
// itself; a synthetic model gets a dense perturbation of the same lr instead).
Status rl_step(const SyncOptions& o, Weights& w) {
  if (o.synthetic_mb > 0) {
    std::mt19937 rng(2);
    for (float& x : w.values.all()) x = x + (static_cast<float>(rng() % 3) - 1.0f) * 1e-6f;
    return Status::Ok();
  }
  TrainerConfig tc;
  tc.lr.lr = 1e-6;
  MILES_ASSIGN_OR_RETURN(auto tr, Trainer::create(w.config, w.values.as_tensor_map(), tc, nullptr));
  std::mt19937 rng(3);
  std::vector<TrainSample> batch(4);
  std::vector<RlSampleData> data(4);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 48; ++j) batch[i].tokens.push_back(rng() % w.config.vocab_size);
    batch[i].response_length = 32;
    batch[i].loss_mask.assign(32, 1.0f);
  }
  MILES_ASSIGN_OR_RETURN(auto scored, tr->score(batch, false));
  for (int i = 0; i < 4; ++i) {
    data[i].old_logp = scored[i].logp;
    data[i].advantages.assign(32, i % 2 ? 1.0f : -1.0f);
  }
  MILES_ASSIGN_OR_RETURN(auto obj, rl_objective(batch, data, rl::LossConfig{}));
  MILES_RETURN_IF_ERROR(tr->step(batch, obj).status());
  std::copy(tr->params().all().begin(), tr->params().all().end(), w.values.all().begin());
  return Status::Ok();
}

// One compression's directory: a full version 1 and the delta 2.
const char* encoding_name(DeltaEncoding e) {
  return e == DeltaEncoding::kDifference ? "difference"
         : e == DeltaEncoding::kXor      ? "xor"
                                         : "overwrite";
}
const char* compression_name(DeltaCompression c) {
  return c == DeltaCompression::kSmall ? "small" : "fast";
}

struct DeltaDir {
  DeltaEncoding encoding;
  DeltaCompression compression;
  std::string dir;
  DiskDeltaWriter writer;
  PublishStats full, delta;
};

// The files under `dir` out of the page cache (a hint, as disk_read_mbps's file).
void drop_from_page_cache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// A directory's versions read back with every checksum verified, each way a reader does: load(2)
// from nothing (a joining engine: v1's files, then v2's), advance(v1 -> v2) (an engine following
// the versions: v2's files only), and an engine's update: its receiver (which keeps the version it
// holds as the next delta's base) at v1, then receive(v2) (the advance, and that set lent to the
// engine with the checksums the reader verified). Fastest of --repeats each; every timed read
// starts with the files dropped from the page cache, the copy of v1 and the receiver's v1 made
// outside the timing.
struct ReadTimes {
  double load = 1e30, advance = 1e30, receive = 1e30;
};

Result<ReadTimes> time_reads(const SyncOptions& o, const Weights& w, const DeltaDir& d) {
  DiskDeltaReader reader(d.dir);
  ReadTimes t;
  const auto since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  MILES_ASSIGN_OR_RETURN(const WeightSet v1, reader.load(1));
  MILES_ASSIGN_OR_RETURN(TransferPlan plan,
                         make_transfer_plan(w.config, *w.layout, ParallelLayout{}));
  for (int r = 0; r < std::max(1, o.repeats); ++r) {
    drop_from_page_cache(d.dir);
    auto t0 = Clock::now();
    MILES_RETURN_IF_ERROR(reader.load(2).status());
    t.load = std::min(t.load, since(t0));
    WeightSet current = v1;
    drop_from_page_cache(d.dir);
    t0 = Clock::now();
    MILES_RETURN_IF_ERROR(reader.advance(current, 1, 2));
    t.advance = std::min(t.advance, since(t0));
    auto rx = make_disk_delta_receiver(d.dir, plan);
    MILES_RETURN_IF_ERROR(rx->receive(1).status());
    drop_from_page_cache(d.dir);
    t0 = Clock::now();
    MILES_RETURN_IF_ERROR(rx->receive(2).status());
    t.receive = std::min(t.receive, since(t0));
  }
  return t;
}

// disk-delta: publish a full version, then the delta after one RL step, in each compression
// (DeltaCompression) with the default encoding (difference) and in xor (the encoding it replaced),
// and read both back.
int run_disk_delta(const SyncOptions& o, Weights& w) {
  const std::string dir = "/tmp/miles-bench-sync-delta-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const double disk = disk_write_mbps(dir), disk_read = disk_read_mbps(dir);
  std::vector<DeltaDir> dirs;
  for (const auto& [e, c] : {std::pair{DeltaEncoding::kDifference, DeltaCompression::kSmall},
                             std::pair{DeltaEncoding::kDifference, DeltaCompression::kFast},
                             std::pair{DeltaEncoding::kXor, DeltaCompression::kSmall}}) {
    DiskDeltaOptions options;
    options.encoding = e;
    options.compression = c;
    const std::string sub = dir + "/" + encoding_name(e) + "-" + compression_name(c);
    dirs.push_back({e, c, sub, DiskDeltaWriter(sub, options), {}, {}});
  }
  for (DeltaDir& d : dirs) {
    auto full = d.writer.publish(1, weight_set_of(w.values));
    if (!full.ok()) return fail("bench sync", full.message());
    d.full = *full;
  }
  if (Status s = rl_step(o, w); !s.ok()) return fail("bench sync", "RL step: " + s.message());
  for (DeltaDir& d : dirs) {
    auto delta = d.writer.publish(2, weight_set_of(w.values));
    if (!delta.ok()) return fail("bench sync", delta.message());
    d.delta = *delta;
  }
  const std::string name =
      o.synthetic_mb > 0 ? "synthetic " + std::to_string(o.synthetic_mb) + " MB" : o.model;
  std::printf("disk write + fsync (256 MB, best of 3): %.0f MB/s\n", disk);
  std::printf("disk read, page cache dropped (256 MB, best of 3): %.0f MB/s\n", disk_read);
  const auto of_disk = [&](double mb, double s) {
    return disk_read > 0 ? mb / s / disk_read : 0.0;
  };
  for (const DeltaDir& d : dirs) {
    auto times = time_reads(o, w, d);
    if (!times.ok()) return fail("bench sync", times.message());
    const double load_s = times->load, advance_s = times->advance;
    // What each read: both versions' files (load), the delta's (advance).
    const double full_mb = d.full.bytes_written / 1e6, delta_mb = d.delta.bytes_written / 1e6;
    const double weights_mb = d.full.raw_bytes / 1e6;  // what a load or an advance delivers
    std::printf(
        "| disk-delta, compression %s, encoding %s | %s | full v1: %.1f MB written in %.3f s = "
        "%.0f MB/s of weights (%.2f of disk) | delta v2 after one %s step: %.1f MB (%.3f of full), "
        "%lld of %lld tensors, %.3f s | reader load(v2) with checks: %.3f s, %.0f MB of files = "
        "%.0f MB/s (%.2f of disk read), %.0f MB of weights = %.0f MB/s (%.2f of disk read) | "
        "advance(v1 -> v2) with checks: %.3f s, %.0f MB = %.0f MB/s (%.2f of disk read) | an "
        "engine's receive(v2) after v1: %.3f s |\n",
        compression_name(d.compression), encoding_name(d.encoding), name.c_str(), full_mb,
        d.full.seconds, d.full.raw_bytes / d.full.seconds / 1e6,
        d.full.raw_bytes / d.full.seconds / 1e6 / disk,
        o.synthetic_mb > 0 ? "dense synthetic" : "RL (PPO, lr 1e-6)", delta_mb,
        static_cast<double>(d.delta.bytes_written) / d.full.bytes_written,
        static_cast<long long>(d.delta.tensors_stored), static_cast<long long>(d.delta.tensors),
        d.delta.seconds, load_s, full_mb + delta_mb, (full_mb + delta_mb) / load_s,
        of_disk(full_mb + delta_mb, load_s), weights_mb, weights_mb / load_s,
        of_disk(weights_mb, load_s), advance_s, delta_mb, delta_mb / advance_s,
        of_disk(delta_mb, advance_s), times->receive);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

// p2p-hop, one transfer: the sender sends whole tensors to every engine's rank 0 (ranks
// 1..engines), which verifies them, slices them as a tensor-parallel engine does
// (tensor_parallel::slice) and sends each follower its shard (engine e's follower j is rank 1 +
// engines + e * (engine_tp − 1) + j − 1).
Status hop_transfer(Communicator& comm, const SyncOptions& o, const Weights& w,
                    const TransferPlan& plan, int64_t version, const TensorSource& source) {
  const int n = o.engine_tp, first_follower = 1 + o.engines;
  const P2pRoles to_leaders{ParallelLayout{}, o.engines, 1};
  MILES_ASSIGN_OR_RETURN(ModelConfig local, tensor_parallel::local_config(w.config, n));
  FlatTensors shard(ParamLayout::for_model(local));
  if (comm.rank() == 0) return p2p_send_weights(comm, plan, version, source, to_leaders);
  if (comm.rank() < first_follower) {
    ReceivedWeights got;
    MILES_RETURN_IF_ERROR(p2p_receive_weights(comm, plan, version, to_leaders, &got));
    MILES_RETURN_IF_ERROR(verify_received_weights(got, plan));
    MILES_ASSIGN_OR_RETURN(FlatTensors full, FlatTensors::from_tensor_map(w.layout, got.view()));
    const int e = comm.rank() - 1;
    for (int j = 1; j < n; ++j) {
      tensor_parallel::slice(full, shard, j, n);
      MILES_RETURN_IF_ERROR(comm.send(shard.all().data(), shard.all().size_bytes(),
                                      first_follower + e * (n - 1) + j - 1, 7));
    }
    return Status::Ok();
  }
  const int e = (comm.rank() - first_follower) / (n - 1);
  return comm.recv(shard.all().data(), shard.all().size_bytes(), 1 + e, 7);
}

// One process of the measurement: rank 0 sends, the others receive (and verify) each repeat.
Status run_worker(const SyncOptions& o) {
  MILES_ASSIGN_OR_RETURN(Weights w, load_weights(o));
  MILES_ASSIGN_OR_RETURN(TransferPlan plan,
                         make_transfer_plan(w.config, *w.layout, ParallelLayout{},
                                            {.bucket_bytes = o.bucket_mb << 20}));
  CommOptions co;
  co.rank = o.rank;
  co.world_size = 1 + o.engines * o.engine_tp;
  co.store_address = o.store;
  co.prefix = "bench-sync-" + o.transport;
  co.timeout = std::chrono::milliseconds(600'000);
  co.prefix += "-" + o.comm;
  std::unique_ptr<Communicator> comm;
  if (o.comm == "shm") {
    MILES_ASSIGN_OR_RETURN(comm, connect_shm(co));
  } else if (o.comm == "gloo") {
    MILES_ASSIGN_OR_RETURN(comm, connect_gloo(co));
  } else {
    return Status::Error("unknown comm '" + o.comm + "' (gloo, shm)");
  }
  const TensorSource source = [&](const std::string& n) { return std::as_const(w.values).get(n); };
  const P2pRoles roles{ParallelLayout{}, o.engines, o.engine_tp};
  double best = 1e30;
  ReceivedWeights got;  // an engine's staging buffers, filled again by each version
  for (int r = 0; r < o.repeats; ++r) {
    MILES_RETURN_IF_ERROR(comm->barrier());
    const auto t0 = Clock::now();
    if (o.transport == "broadcast") {
      // Tensor-parallel engines: every rank is a member, checks each tensor and keeps its shard.
      BroadcastOptions bo;
      bo.shard_rank = o.rank > 0 ? (o.rank - 1) % o.engine_tp : 0;
      bo.shard_size = o.engine_tp;
      MILES_RETURN_IF_ERROR(broadcast_weights(*comm, plan, r + 1, o.rank == 0 ? source : nullptr,
                                              o.rank ? &got : nullptr, bo));
    } else if (o.transport == "p2p") {
      if (o.rank == 0) {
        MILES_RETURN_IF_ERROR(p2p_send_weights(*comm, plan, r + 1, source, roles));
      } else {
        // Every piece's checksum is verified on arrival; a whole-tensor receiver also checks
        // the assembled tensors.
        MILES_RETURN_IF_ERROR(p2p_receive_weights(*comm, plan, r + 1, roles, &got));
        if (o.engine_tp == 1) MILES_RETURN_IF_ERROR(verify_received_weights(got, plan));
      }
    } else if (o.transport == "p2p-hop") {
      MILES_RETURN_IF_ERROR(hop_transfer(*comm, o, w, plan, r + 1, source));
    } else {
      return Status::Error("unknown transport '" + o.transport + "' (broadcast, p2p, p2p-hop)");
    }
    // A broadcast receiver hashed every tensor as it arrived and compared it with the sender's
    // (broadcast_weights); this completes the check of the staged set.
    if (o.rank != 0 && o.transport == "broadcast" && o.engine_tp == 1)
      MILES_RETURN_IF_ERROR(verify_received_weights(got, plan));
    MILES_RETURN_IF_ERROR(comm->barrier());
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (o.rank == 0) {
    nlohmann::json j{
        {"seconds", best}, {"bytes", plan.total_bytes}, {"buckets", plan.buckets.size()}};
    std::ofstream(o.out) << j.dump();
  }
  return Status::Ok();
}

// One group transport over one communicator: the sender and the receivers as processes.
int run_group_transport(const SyncOptions& o, const std::string& t, const std::string& comm,
                        double copy, double tcp) {
  auto store = TcpStoreServer::start({});
  if (!store.ok()) return fail("bench sync", store.message());
  const std::string out = "/tmp/miles-bench-sync-" + std::to_string(getpid()) + ".json";
  std::vector<std::vector<std::string>> argvs;
  if (t == "p2p-hop" && o.engine_tp < 2)
    return fail("bench sync", "p2p-hop needs --engine-tp >= 2");
  const int procs = 1 + o.engines * o.engine_tp;
  for (int r = 0; r < procs; ++r) {
    std::vector<std::string> a{controller::miles_executable(),
                               "bench",
                               "sync-worker",
                               "--rank",
                               std::to_string(r),
                               "--engines",
                               std::to_string(o.engines),
                               "--store",
                               (*store)->address(),
                               "--transport",
                               t,
                               "--comm",
                               comm,
                               "--repeats",
                               std::to_string(o.repeats),
                               "--bucket-mb",
                               std::to_string(o.bucket_mb),
                               "--engine-tp",
                               std::to_string(o.engine_tp),
                               "--out",
                               out};
    if (o.synthetic_mb > 0) {
      a.insert(a.end(), {"--synthetic-mb", std::to_string(o.synthetic_mb)});
    } else {
      a.insert(a.end(), {"--model", o.model});
    }
    argvs.push_back(std::move(a));
  }
  if (Status s = run_local_workers(procs, argvs); !s.ok()) return fail("bench sync", s.message());
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  std::remove(out.c_str());
  if (j.is_discarded()) return fail("bench sync", "no result from the sender");
  const double secs = j["seconds"].get<double>(), bytes = j["bytes"].get<double>();
  const double gbps = bytes * o.engines / secs / 1e9;  // bytes delivered
  std::printf("| %s | %s | %s | %.1f | %lld | %d x %d | %.4f | %.2f | %.2f | %.2f |\n", t.c_str(),
              comm.c_str(),
              o.synthetic_mb > 0 ? ("synthetic " + std::to_string(o.synthetic_mb) + " MB").c_str()
                                 : o.model.c_str(),
              bytes / (1 << 20), static_cast<long long>(j["buckets"].get<int64_t>()), o.engines,
              o.engine_tp, secs, gbps, gbps / copy, tcp > 0 ? gbps / tcp : 0.0);
  return 0;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string list = text + ",";
  for (size_t pos = 0, next; (next = list.find(',', pos)) != std::string::npos; pos = next + 1)
    if (next > pos) out.push_back(list.substr(pos, next - pos));
  return out;
}

int run_bench(const SyncOptions& o) {
  const double copy = memcpy_gbps(), tcp = tcp_stream_gbps(true), tcp_hot = tcp_stream_gbps(false);
  std::printf("memcpy (1 thread, 256 MB, best of 5): %.2f GB/s\n", copy);
  std::printf("xxh3-128 (1 thread, 256 MB, best of 5): %.2f GB/s\n", xxh3_gbps());
  std::printf(
      "TCP stream over loopback (one socket, 256 MB between two 256 MB buffers, best of 3): %.2f "
      "GB/s (from and into one 4 MiB buffer that stays in cache: %.2f GB/s)\n",
      tcp, tcp_hot);
  std::printf(
      "| transport | comm | weights | MB | buckets | engines x tp ranks | seconds | GB/s | / "
      "memcpy "
      "| / TCP stream |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& comm : split_list(o.comms))
    if (comm != "gloo" && comm != "shm")
      return fail("bench sync", "--comm: unknown '" + comm + "' (gloo, shm)");
  for (const std::string& t : split_list(o.transports)) {
    if (t == "disk-delta") {
      auto w = load_weights(o);
      if (!w.ok()) return fail("bench sync", w.message());
      if (int rc = run_disk_delta(o, *w); rc != 0) return rc;
      continue;
    }
    for (const std::string& comm : split_list(o.comms))
      if (int rc = run_group_transport(o, t, comm, copy, tcp); rc != 0) return rc;
  }
  std::printf(
      "GB/s counts the bytes delivered to all engines; each receiver verifies every xxh3-128.\n");
  return 0;
}
void add_common(CLI::App* s, SyncOptions* o) {
  s->add_option("--model", o->model, "HF directory or llama2.c checkpoint");
  s->add_option("--synthetic-mb", o->synthetic_mb,
                "a random Llama-shaped model of about N MB instead");
  s->add_option("--engines", o->engines, "receiving processes");
  s->add_option("--repeats", o->repeats, "transfers; the fastest counts");
  s->add_option("--bucket-mb", o->bucket_mb, "bucket size");
  s->add_option("--engine-tp", o->engine_tp,
                "tensor-parallel ranks per engine (each keeps its shard; p2p-hop: via rank 0)")
      ->check(CLI::Range(1, 1024));
}

}  // namespace

void register_bench_sync(CLI::App& bench) {
  auto o = std::make_shared<SyncOptions>();
  CLI::App* s = bench.add_subcommand("sync", "Weight transfer time and bandwidth per transport");
  add_common(s, o.get());
  s->add_option("--transport", o->transports,
                "comma-separated: broadcast,p2p,disk-delta (p2p-hop with --engine-tp)");
  s->add_option("--comm", o->comms,
                "comma-separated communicators for broadcast / p2p: gloo (TCP), shm (shared "
                "memory, one host)");
  s->callback([o] {
    if (o->model.empty() && o->synthetic_mb <= 0)
      std::exit(fail("bench sync", "--model or --synthetic-mb"));
    if (int rc = run_bench(*o); rc != 0) std::exit(rc);
  });
  auto w = std::make_shared<SyncOptions>();
  CLI::App* wk =
      bench.add_subcommand("sync-worker", "one process of `miles bench sync` (internal)");
  add_common(wk, w.get());
  wk->add_option("--rank", w->rank);
  wk->add_option("--store", w->store);
  wk->add_option("--transport", w->transport);
  wk->add_option("--comm", w->comm);
  wk->add_option("--out", w->out);
  wk->group("");  // hidden
  wk->callback([w] {
    if (Status st = run_worker(*w); !st.ok()) std::exit(fail("bench sync-worker", st.message()));
  });
}

}  // namespace miles::cli
