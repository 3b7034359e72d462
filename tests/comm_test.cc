// Communication layer: the parallel layout, the halving tree, the TCP store, and the Gloo
// communicator between real processes over loopback (world sizes 1-4, a dp=2,pp=2,tp=2 grid of 8,
// dead and missing peers). Multi-process cases fork one child per rank (tests/multiprocess.h).
#include "miles/comm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "kernels/reduce.h"
#include "miles/parallel_layout.h"
#include "miles/tcp_store.h"
#include "multiprocess.h"

namespace miles {
namespace {

using std::chrono::milliseconds;
using testing::ChildResult;
using testing::from_hex;
using testing::run_processes;
using testing::StoreProcess;
using testing::to_hex;

constexpr milliseconds kOpTimeout{20'000};  // generous: 2 busy cores shared with other builds
constexpr milliseconds kRunDeadline{45'000};

// ---- parallel layout ---------------------------------------------------------------------------

TEST(ParallelLayout, MegatronRankOrder) {
  auto layout = ParallelLayout::create(/*dp=*/2, /*pp=*/2, /*tp=*/2);
  ASSERT_TRUE(layout.ok()) << layout.message();
  const ParallelLayout& l = *layout;
  EXPECT_EQ(l.world_size(), 8);
  // tp fastest, then dp, then pp.
  EXPECT_EQ(l.coord(0), (RankCoord{.dp = 0, .pp = 0, .tp = 0}));
  EXPECT_EQ(l.coord(1), (RankCoord{.dp = 0, .pp = 0, .tp = 1}));
  EXPECT_EQ(l.coord(2), (RankCoord{.dp = 1, .pp = 0, .tp = 0}));
  EXPECT_EQ(l.coord(5), (RankCoord{.dp = 0, .pp = 1, .tp = 1}));
  EXPECT_EQ(l.coord(7), (RankCoord{.dp = 1, .pp = 1, .tp = 1}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(l.rank_of(l.coord(r)), r);
  EXPECT_EQ(l.tp_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.dp_group(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.pp_group(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.all_tp_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.all_dp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.all_pp_groups(), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.stage_leader(0), 0);
  EXPECT_EQ(l.stage_leader(1), 4);
  EXPECT_TRUE(l.is_first_stage(3));
  EXPECT_TRUE(l.is_last_stage(4));
  EXPECT_EQ(l.next_stage_rank(2), 6);
  EXPECT_EQ(l.next_stage_rank(6), std::nullopt);
  EXPECT_EQ(l.prev_stage_rank(6), 2);
  EXPECT_EQ(l.prev_stage_rank(1), std::nullopt);
}

TEST(ParallelLayout, GroupsPartitionTheWorld) {
  auto l = ParallelLayout::create(3, 2, 4);
  ASSERT_TRUE(l.ok());
  for (const auto& groups : {l->all_tp_groups(), l->all_dp_groups(), l->all_pp_groups()}) {
    std::vector<int> seen(l->world_size(), 0);
    for (const auto& g : groups) {
      for (int r : g) ++seen[r];
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
  // A rank's index in each of its groups is its coordinate in that dimension.
  for (int r = 0; r < l->world_size(); ++r) {
    const RankCoord c = l->coord(r);
    EXPECT_EQ(l->tp_group(r)[c.tp], r);
    EXPECT_EQ(l->dp_group(r)[c.dp], r);
    EXPECT_EQ(l->pp_group(r)[c.pp], r);
  }
}

TEST(ParallelLayout, Parse) {
  auto l = ParallelLayout::parse("dp=2,pp=1,tp=2");
  ASSERT_TRUE(l.ok()) << l.message();
  EXPECT_EQ(l->dp(), 2);
  EXPECT_EQ(l->pp(), 1);
  EXPECT_EQ(l->tp(), 2);
  auto reordered = ParallelLayout::parse(" tp = 4 , dp=3 ");
  ASSERT_TRUE(reordered.ok()) << reordered.message();
  EXPECT_EQ(reordered->to_string(), "dp=3,pp=1,tp=4");
  auto round = ParallelLayout::parse(reordered->to_string());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(*round, *reordered);
  EXPECT_TRUE(l->check_world_size(4).ok());
  const Status wrong = l->check_world_size(3);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("needs dp*pp*tp = 4"), std::string::npos) << wrong.message();
}

TEST(ParallelLayout, BadStringsAreErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty"},
      {"   ", "empty"},
      {"dp=0,pp=1,tp=1", "must be positive"},
      {"dp=-2", "must be positive"},
      {"dp=2,dp=3", "given twice"},
      {"xp=2", "unknown key \"xp\""},
      {"dp=two", "not an integer"},
      {"dp=2x", "not an integer"},
      {"dp=", "not an integer"},
      {"dp=2,,tp=2", "empty entry"},
      {"dp=2,", "empty entry"},
      {"dp", "not key=value"},
      {"dp=2;tp=2", "not an integer"},
      {"dp=99999,pp=99999,tp=99999", "too large"},
  };
  for (const auto& [spec, expected] : cases) {
    auto l = ParallelLayout::parse(spec);
    ASSERT_FALSE(l.ok()) << "\"" << spec << "\" parsed";
    EXPECT_NE(l.message().find(expected), std::string::npos)
        << "\"" << spec << "\": " << l.message();
    EXPECT_NE(l.message().find("parallel layout"), std::string::npos) << l.message();
  }
  EXPECT_FALSE(ParallelLayout::create(1, 0, 1).ok());
}

// ---- halving tree ------------------------------------------------------------------------------

TEST(HalvingTree, ShapeMatchesKernelsContract) {
  // Values chosen so that every association gives a different float.
  const float v[5] = {1e8f, 3.0f, -1e8f, 5.0f, 0.25f};
  float out = 0;
  halving_tree_sum(v, 1, 1, &out);
  EXPECT_EQ(out, v[0]);
  halving_tree_sum(v, 3, 1, &out);  // [0,3) -> [0,2) + [2,3)
  EXPECT_EQ(out, (v[0] + v[1]) + v[2]);
  halving_tree_sum(v, 4, 1, &out);  // (0+1) + (2+3)
  EXPECT_EQ(out, (v[0] + v[1]) + (v[2] + v[3]));
  halving_tree_sum(v, 5, 1, &out);  // [0,5) -> [0,3) + [3,5)
  EXPECT_EQ(out, ((v[0] + v[1]) + v[2]) + (v[3] + v[4]));
  // Column-wise: each column is its own tree.
  const double rows[3 * 2] = {1, 10, 2, 20, 3, 30};
  double cols[2];
  halving_tree_sum(rows, 3, 2, cols);
  EXPECT_EQ(cols[0], 6.0);
  EXPECT_EQ(cols[1], 60.0);
}

// ---- tcp store ---------------------------------------------------------------------------------

TEST(TcpStore, SetGetWaitAddCheckRemove) {
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok()) << server.message();
  EXPECT_GT((*server)->port(), 0);
  const std::string address = (*server)->address();
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u);
  auto a = TcpStoreClient::connect({address, milliseconds(2000)});
  auto b = TcpStoreClient::connect({address, milliseconds(2000)});
  ASSERT_TRUE(a.ok() && b.ok()) << a.message() << b.message();

  const std::string binary("x\0y\xff", 4);
  ASSERT_TRUE((*a)->set("k", binary).ok());
  auto got = (*b)->get("k", milliseconds(1000));
  ASSERT_TRUE(got.ok()) << got.message();
  EXPECT_EQ(*got, binary);

  // A blocked get returns as soon as another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE((*a)->set("late", "v").ok());
  });
  auto late = (*b)->get("late", milliseconds(10'000));
  setter.join();
  ASSERT_TRUE(late.ok()) << late.message();
  EXPECT_EQ(*late, "v");

  // Timeouts are errors naming the missing keys.
  const auto t0 = std::chrono::steady_clock::now();
  const Status w = (*b)->wait({"k", "absent1", "absent2"}, milliseconds(200));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.message().find("absent1, absent2"), std::string::npos) << w.message();
  auto missing = (*b)->get("absent1", milliseconds(50));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("\"absent1\""), std::string::npos) << missing.message();
  // The connection stays usable after a timeout.
  EXPECT_TRUE((*b)->wait({"k", "late"}, milliseconds(50)).ok());

  auto c1 = (*a)->add("counter", 5);
  auto c2 = (*b)->add("counter", -2);
  ASSERT_TRUE(c1.ok() && c2.ok());
  EXPECT_EQ(*c1, 5);
  EXPECT_EQ(*c2, 3);
  EXPECT_EQ(*(*a)->get("counter", milliseconds(10)), "3");

  EXPECT_TRUE(*(*a)->check({"k", "counter"}));
  EXPECT_FALSE(*(*a)->check({"k", "nope"}));
  EXPECT_TRUE(*(*a)->remove("k"));
  EXPECT_FALSE(*(*a)->remove("k"));
  EXPECT_FALSE(*(*a)->check({"k"}));
}

TEST(TcpStore, ServerGoneIsAnErrorNotAHang) {
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok());
  const std::string address = (*server)->address();
  auto client = TcpStoreClient::connect({address, milliseconds(2000)});
  ASSERT_TRUE(client.ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(100));
    server->reset();  // while the client is blocked in get
  });
  auto r = (*client)->get("never", milliseconds(30'000));
  stopper.join();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find(address), std::string::npos) << r.message();

  // Nobody listens there now: connecting fails after the connect timeout, naming the address.
  const auto t0 = std::chrono::steady_clock::now();
  auto none = TcpStoreClient::connect({address, milliseconds(300)});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find(address), std::string::npos) << none.message();
}

TEST(TcpStore, AStoreWithATokenServesOnlyClientsThatPresentIt) {
  TcpStoreServerOptions so;
  so.token = "run-secret";
  auto server = TcpStoreServer::start(so);
  ASSERT_TRUE(server.ok());
  const std::string address = (*server)->address();
  auto good = TcpStoreClient::connect({address, milliseconds(2000), "run-secret"});
  ASSERT_TRUE(good.ok()) << good.message();
  ASSERT_TRUE((*good)->set("k", "v").ok());
  // A wrong token is refused at connect; no token at all on the first request. Neither sees data.
  auto wrong = TcpStoreClient::connect({address, milliseconds(2000), "guess"});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("MILES_RUN_TOKEN"), std::string::npos) << wrong.message();
  auto none = TcpStoreClient::connect({address, milliseconds(2000), ""});
  ASSERT_TRUE(none.ok());  // nothing is said until its first request
  auto r = (*none)->get("k", milliseconds(100));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("token"), std::string::npos) << r.message();
  EXPECT_FALSE((*none)->set("k", "overwritten").ok());
  EXPECT_EQ(*(*good)->get("k", milliseconds(100)), "v");
  // A store without a token takes clients that present one (a run's processes always do).
  auto open = TcpStoreServer::start(TcpStoreServerOptions{.token = ""});
  ASSERT_TRUE(open.ok());
  auto c = TcpStoreClient::connect({(*open)->address(), milliseconds(2000), "run-secret"});
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_TRUE((*c)->set("a", "b").ok());
}

TEST(TcpStore, BadAddresses) {
  for (const char* a : {"localhost", "127.0.0.1:", "127.0.0.1:99999", ":80", "::1:80", "[::1"}) {
    auto c = TcpStoreClient::connect({a, milliseconds(10)});
    ASSERT_FALSE(c.ok()) << a;
    EXPECT_NE(c.message().find("expected host:port"), std::string::npos) << c.message();
  }
}

TEST(ConnectGloo, NoStoreIsAnErrorNamingTheAddress) {
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok());
  const std::string address = (*server)->address();
  server->reset();
  CommOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.store_address = address;
  o.timeout = milliseconds(300);
  auto comm = connect_gloo(o);
  ASSERT_FALSE(comm.ok());
  std::printf("  %s\n", comm.message().c_str());
  EXPECT_NE(comm.message().find(address), std::string::npos) << comm.message();
  EXPECT_NE(comm.message().find("rank 0 of 2"), std::string::npos) << comm.message();

  o.rank = 2;
  EXPECT_FALSE(connect_gloo(o).ok());
}

// ---- communicator between processes ------------------------------------------------------------

// Rank r's partials: a reproducible mix of magnitudes and signs, so that the summation order shows.
std::vector<float> partials_of(int rank, size_t n) {
  std::vector<float> v(n);
  uint32_t s = 0x9e3779b9u * static_cast<uint32_t>(rank + 1);
  for (size_t j = 0; j < n; ++j) {
    s = s * 1664525u + 1013904223u;
    const float unit = static_cast<float>(s >> 8) / static_cast<float>(1u << 24) - 0.5f;
    v[j] = std::ldexp(unit, static_cast<int>((s >> 3) % 24) - 8);
  }
  return v;
}

CommOptions options_for(int rank, int world, const std::string& store, const std::string& prefix) {
  CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_address = store;
  o.prefix = prefix;
  o.timeout = kOpTimeout;
  return o;
}

#define CHILD_CHECK(expr)                                                     \
  do {                                                                        \
    const ::miles::Status s_ = (expr);                                        \
    if (!s_.ok()) return std::string("error=") + #expr + ": " + s_.message(); \
  } while (0)

void expect_all_ok(const std::vector<ChildResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << ": " << results[r].describe();
    const auto f = results[r].fields();
    EXPECT_EQ(f.count("error"), 0u) << "rank " << r << ": " << f.at("error");
    EXPECT_EQ(f.count("exception"), 0u) << "rank " << r << ": " << results[r].output;
  }
}

// Every rank's partials_of(rank, n), in rank order: an allgather's result.
std::vector<float> gather_of(int world, size_t n) {
  std::vector<float> all;
  for (int r = 0; r < world; ++r) {
    const auto p = partials_of(r, n);
    all.insert(all.end(), p.begin(), p.end());
  }
  return all;
}

// Runs every collective on a world of `world` ranks; `host_store` makes rank 0 run the store;
// `shm`: the shared-memory back-end instead of Gloo.
void check_collectives(int world, bool host_store, bool shm = false) {
  constexpr size_t kN = 1000;
  std::unique_ptr<StoreProcess> store_process;
  std::string store;
  if (host_store) {
    // A port that was free a moment ago, for rank 0 to bind.
    auto probe = TcpStoreServer::start({});
    ASSERT_TRUE(probe.ok());
    store = (*probe)->address();
  } else {
    store_process = std::make_unique<StoreProcess>();
    ASSERT_TRUE(store_process->ok());
    store = store_process->address();
  }
  const std::string prefix = "collectives" + std::to_string(world);
  auto results = run_processes(
      world,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, world, store, prefix);
        o.host_store = host_store;
        auto comm = shm ? connect_shm(o) : connect_gloo(o);
        if (!comm.ok()) return "error=" + comm.message();
        Communicator& c = **comm;
        std::string out =
            "rank=" + std::to_string(c.rank()) + "\nsize=" + std::to_string(c.size()) + "\n";
        CHILD_CHECK(c.barrier());
        // broadcast from the last rank
        std::vector<float> b = partials_of(100 + rank, 17);
        CHILD_CHECK(c.broadcast(b, world - 1));
        out += "bcast=" + to_hex(b) + "\n";
        // allgather
        std::vector<float> mine = partials_of(rank, 33);
        std::vector<float> all(33 * world);
        CHILD_CHECK(c.allgather(mine, all));
        out += "gather=" + to_hex(all) + "\n";
        // deterministic sums
        std::vector<float> s = partials_of(rank, kN);
        CHILD_CHECK(c.all_reduce_sum_deterministic(s));
        out += "sum=" + to_hex(s) + "\n";
        std::vector<double> d = {0.1 * rank, 1.0 / (rank + 3)};
        CHILD_CHECK(c.all_reduce_sum(std::span<double>(d)));
        out += "dsum=" + to_hex(d) + "\n";
        std::vector<int64_t> counts = {rank + 1, int64_t{1} << 40};
        CHILD_CHECK(c.all_reduce_sum(std::span<int64_t>(counts)));
        out += "isum=" + to_hex(counts) + "\n";
        std::vector<float> m = partials_of(rank, 64);
        if (rank == world - 1) m[3] = NAN;
        CHILD_CHECK(c.all_reduce_max(m));
        out += "max=" + to_hex(m) + "\n";
        // Ring of sends: each rank passes its rank to the next.
        if (world > 1) {
          const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
          std::vector<float> token = {static_cast<float>(rank)}, got = {-1.0f};
          if (rank % 2 == 0) {
            CHILD_CHECK(c.send(token, next, 3));
            CHILD_CHECK(c.recv(got, prev, 3));
          } else {
            CHILD_CHECK(c.recv(got, prev, 3));
            CHILD_CHECK(c.send(token, next, 3));
          }
          out += "ring=" + std::to_string(static_cast<int>(got[0])) + "\n";
          // Messages larger than the shared-memory back-end's slots and mailboxes (1 MiB).
          std::vector<float> big = partials_of(200 + rank, 700'000), big_got(700'000);
          if (rank % 2 == 0) {
            CHILD_CHECK(c.send(big, next, 4));
            CHILD_CHECK(c.recv(big_got, prev, 4));
          } else {
            CHILD_CHECK(c.recv(big_got, prev, 4));
            CHILD_CHECK(c.send(big, next, 4));
          }
          out += "big_ring=" + std::to_string(big_got == partials_of(200 + prev, 700'000)) + "\n";
          std::vector<float> wide = partials_of(300 + rank, 600'000), wide_all(600'000 * world);
          CHILD_CHECK(c.allgather(wide, wide_all));
          bool wide_ok = true;
          for (int k = 0; k < world; ++k)
            wide_ok &= std::equal(wide_all.begin() + k * 600'000,
                                  wide_all.begin() + (k + 1) * 600'000,
                                  partials_of(300 + k, 600'000).begin());
          out += "big_gather=" + std::to_string(wide_ok) + "\n";
          std::vector<float> bb = partials_of(400 + rank, 800'000);
          CHILD_CHECK(c.broadcast(bb, 0));
          out += "big_bcast=" + std::to_string(bb == partials_of(400, 800'000)) + "\n";
          // Chunked broadcasts back to back from two roots (the shared-memory back-end pipelines
          // them through every rank's slot), then a collective: every piece is handed over in
          // order, final when handed over, and the buffers are whole. From root 0 the caller
          // copies: pieces it is given go in order, each before it is handed over.
          bool chunks_ok = true;
          for (int root : {world - 1, 0}) {
            std::vector<float> x = partials_of(500 + rank, 1'450'000);  // 5.5 MiB
            const std::vector<float> want = partials_of(500 + root, 1'450'000);
            size_t next_off = 0, copied_to = 0;
            Communicator::ChunkHooks hooks;
            hooks.arrived = [&](size_t off, size_t n) {
              const char* have = reinterpret_cast<const char*>(x.data()) + off;
              const char* expect = reinterpret_cast<const char*>(want.data()) + off;
              chunks_ok &= off == next_off && std::memcmp(have, expect, n) == 0;
              chunks_ok &= copied_to == 0 || copied_to == off + n;
              next_off = off + n;
            };
            if (root == 0)
              hooks.copy = [&](void* to, const void* from, size_t off, size_t n) {
                chunks_ok &= off == copied_to && off == next_off;
                std::memcpy(to, from, n);
                copied_to = off + n;
              };
            CHILD_CHECK(c.broadcast_chunks(x.data(), x.size() * sizeof(float), root, hooks));
            chunks_ok &= next_off == x.size() * sizeof(float) && x == want;
            if (shm && root == 0) chunks_ok &= copied_to == next_off;  // every piece through it
          }
          std::vector<float> after(33 * world);
          CHILD_CHECK(c.allgather(partials_of(rank, 33), after));
          chunks_ok &= after == gather_of(world, 33);
          out += "chunk_bcast=" + std::to_string(chunks_ok) + "\n";
          // Several buffers as one stream (a bucket's tensors; Gloo posts every receive at once):
          // pieces handed over buffer by buffer in order, each final when handed over, an empty
          // buffer skipped, every buffer whole; from root 0 the caller's copy sees each piece.
          bool buffers_ok = true;
          const std::vector<size_t> counts = {1'450'000, 0, 300, 2'200'000};
          for (int root : {world - 1, 0}) {
            std::vector<std::vector<float>> xs, wants;
            std::vector<Communicator::Buffer> bufs;
            for (size_t j = 0; j < counts.size(); ++j) {
              xs.push_back(partials_of(600 + 10 * static_cast<int>(j) + rank, counts[j]));
              wants.push_back(partials_of(600 + 10 * static_cast<int>(j) + root, counts[j]));
            }
            for (auto& x : xs) bufs.push_back({x.data(), x.size() * sizeof(float)});
            size_t at_buffer = 0, next_off = 0;
            std::vector<size_t> done(counts.size(), 0), copied(counts.size(), 0);
            Communicator::BufferHooks hooks;
            hooks.arrived = [&](size_t j, size_t off, size_t n) {
              if (j != at_buffer) {
                buffers_ok &= j > at_buffer && done[at_buffer] == bufs[at_buffer].bytes;
                at_buffer = j;
                next_off = 0;
              }
              const char* have = reinterpret_cast<const char*>(xs[j].data()) + off;
              const char* expect = reinterpret_cast<const char*>(wants[j].data()) + off;
              buffers_ok &= off == next_off && n > 0 && std::memcmp(have, expect, n) == 0;
              next_off = off + n;
              done[j] = next_off;
            };
            if (root == 0)
              hooks.copy = [&](size_t j, void* to, const void* from, size_t off, size_t n) {
                buffers_ok &= off == copied[j];
                std::memcpy(to, from, n);
                copied[j] = off + n;
              };
            CHILD_CHECK(c.broadcast_buffers(bufs, root, hooks));
            for (size_t j = 0; j < counts.size(); ++j) {
              buffers_ok &= done[j] == bufs[j].bytes && xs[j] == wants[j];
              if (shm && root == 0) buffers_ok &= copied[j] == bufs[j].bytes;
            }
          }
          std::vector<float> after_buffers(17 * world);
          CHILD_CHECK(c.allgather(partials_of(rank, 17), after_buffers));
          buffers_ok &= after_buffers == gather_of(world, 17);
          out += "buffers_bcast=" + std::to_string(buffers_ok) + "\n";
        }
        CHILD_CHECK(c.barrier());  // rank 0 (maybe the store host) leaves last
        return out;
      },
      kRunDeadline);
  expect_all_ok(results);
  if (::testing::Test::HasFailure()) return;

  // The expected values, computed here from the same inputs.
  std::vector<float> gather_expected, sum_rows, max_expected(64, -INFINITY);
  for (int r = 0; r < world; ++r) {
    const auto p = partials_of(r, 33);
    gather_expected.insert(gather_expected.end(), p.begin(), p.end());
    const auto q = partials_of(r, kN);
    sum_rows.insert(sum_rows.end(), q.begin(), q.end());
    auto m = partials_of(r, 64);
    for (size_t j = 0; j < 64; ++j) max_expected[j] = std::max(max_expected[j], m[j]);
  }
  std::vector<float> sum_expected(kN);
  halving_tree_sum(sum_rows.data(), world, kN, sum_expected.data());
  std::vector<double> drows, dsum_expected(2);
  for (int r = 0; r < world; ++r) {
    drows.push_back(0.1 * r);
    drows.push_back(1.0 / (r + 3));
  }
  halving_tree_sum(drows.data(), world, 2, dsum_expected.data());

  for (int r = 0; r < world; ++r) {
    auto f = results[r].fields();
    EXPECT_EQ(f["rank"], std::to_string(r));
    EXPECT_EQ(f["size"], std::to_string(world));
    EXPECT_EQ(f["bcast"], to_hex(partials_of(100 + world - 1, 17))) << "rank " << r;
    EXPECT_EQ(f["gather"], to_hex(gather_expected)) << "rank " << r;
    // Bit for bit the single-process tree, and so the same on every rank.
    EXPECT_EQ(f["sum"], to_hex(sum_expected)) << "rank " << r;
    EXPECT_EQ(f["dsum"], to_hex(dsum_expected)) << "rank " << r;
    const auto isum = from_hex<int64_t>(f["isum"]);
    ASSERT_EQ(isum.size(), 2u);
    EXPECT_EQ(isum[0], int64_t{world} * (world + 1) / 2);
    EXPECT_EQ(isum[1], int64_t{world} << 40);
    auto max = from_hex<float>(f["max"]);
    ASSERT_EQ(max.size(), 64u);
    EXPECT_TRUE(std::isnan(max[3]));
    max[3] = 0;
    max_expected[3] = 0;
    EXPECT_EQ(to_hex(max), to_hex(max_expected)) << "rank " << r;
    if (world > 1) {
      EXPECT_EQ(f["ring"], std::to_string((r + world - 1) % world));
      EXPECT_EQ(f["big_ring"], "1") << "rank " << r;
      EXPECT_EQ(f["big_gather"], "1") << "rank " << r;
      EXPECT_EQ(f["big_bcast"], "1") << "rank " << r;
      EXPECT_EQ(f["chunk_bcast"], "1") << "rank " << r;
      EXPECT_EQ(f["buffers_bcast"], "1") << "rank " << r;
    }
  }
}

TEST(GlooCommunicator, WorldOf1) { check_collectives(1, false); }
TEST(GlooCommunicator, WorldOf2WithRank0HostingTheStore) { check_collectives(2, true); }
TEST(GlooCommunicator, WorldOf3) { check_collectives(3, false); }
TEST(GlooCommunicator, WorldOf4) { check_collectives(4, false); }
TEST(ShmCommunicator, WorldOf1) { check_collectives(1, false, true); }
TEST(ShmCommunicator, WorldOf2) { check_collectives(2, false, true); }
TEST(ShmCommunicator, WorldOf3) { check_collectives(3, false, true); }

// A rank that exits is an error for the others at their next wait, naming it, well before the
// timeout; the segment's name is gone from /dev/shm once everyone had mapped it (segments are named
// "miles-<rank 0's pid>-…": other tests running alongside have their own).
TEST(ShmCommunicator, ARankThatExitsIsAnErrorNamingItAndNothingIsLeftInDevShm) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, 2, store.address(), "shm_dead");
        auto comm = connect_shm(o);
        if (!comm.ok()) return "error=" + comm.message();
        if (rank == 1) _exit(0);  // gone without a word
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<float> x(4), all(8);
        Status s = (*comm)->allgather(std::span<const float>(x), std::span<float>(all));
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        Status again = (*comm)->barrier();
        return "status=" + (s.ok() ? std::string("ok") : s.message()) +
               "\nwaited=" + std::to_string(waited) + "\nagain=" + again.message() +
               "\npid=" + std::to_string(getpid());
      },
      kRunDeadline);
  const auto f = results[0].fields();
  EXPECT_NE(f.at("status").find("rank 1"), std::string::npos) << results[0].describe();
  EXPECT_NE(f.at("status").find("has exited"), std::string::npos) << results[0].describe();
  EXPECT_LT(std::stod(f.at("waited")), 5.0);
  EXPECT_NE(f.at("again").find("broken"), std::string::npos) << f.at("again");
  const std::string mine = "miles-" + f.at("pid") + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_NE(e.path().filename().string().rfind(mine, 0), 0u) << e.path() << " was left behind";
}

// A row-parallel dot split over tp=4 on chunk boundaries, each rank reducing its slice with the
// kernels' chunk tree and the partials summed deterministically, equals the single-process dot bit
// for bit.
TEST(GlooCommunicator, TensorParallelDotMatchesSingleProcessBitwise) {
  constexpr int kTp = 4;
  // 16 chunks, 4 per rank: each rank's slice is a subtree of the full halving tree over chunks.
  constexpr int64_t kK = kTp * 4 * kernels::kGemmChunk;
  constexpr int kRows = 8;
  const auto a = partials_of(1000, kRows * kK);
  const auto x = partials_of(2000, kK);
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  auto results = run_processes(
      kTp,
      [&](int rank) -> std::string {
        auto comm = connect_gloo(options_for(rank, kTp, store.address(), "tpdot"));
        if (!comm.ok()) return "error=" + comm.message();
        const int64_t slice = kK / kTp;
        std::vector<float> y(kRows);
        for (int i = 0; i < kRows; ++i) {
          y[i] = kernels::detail::dot(a.data() + i * kK + rank * slice, x.data() + rank * slice,
                                      slice);
        }
        CHILD_CHECK((*comm)->all_reduce_sum_deterministic(y));
        return "y=" + to_hex(y) + "\n";
      },
      kRunDeadline);
  expect_all_ok(results);
  std::vector<float> expected(kRows);
  for (int i = 0; i < kRows; ++i)
    expected[i] = kernels::detail::dot(a.data() + i * kK, x.data(), kK);
  for (int r = 0; r < kTp; ++r)
    EXPECT_EQ(results[r].fields()["y"], to_hex(expected)) << "rank " << r;
}

// dp=2, pp=2, tp=2 on 8 processes: each rank forms its groups and uses each one.
void check_parallel_groups(bool shm) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  auto layout = ParallelLayout::parse("dp=2,pp=2,tp=2");
  ASSERT_TRUE(layout.ok());
  const ParallelLayout l = *layout;
  auto results = run_processes(
      l.world_size(),
      [&](int rank) -> std::string {
        const CommOptions o = options_for(rank, l.world_size(), store.address(), "grid");
        auto world = shm ? connect_shm(o) : connect_gloo(o);
        if (!world.ok()) return "error=" + world.message();
        auto groups = make_parallel_groups(**world, l);
        if (!groups.ok()) return "error=" + groups.message();
        ParallelGroups& g = *groups;
        std::string out;
        // tp: all-gather of world ranks gives the tp group.
        std::vector<float> me = {static_cast<float>(rank)}, tp_all(2);
        CHILD_CHECK(g.tp->allgather(me, tp_all));
        out += "tp=" + std::to_string(int(tp_all[0])) + "," + std::to_string(int(tp_all[1])) + "\n";
        out += "tp_rank=" + std::to_string(g.tp->rank()) + "\n";
        // dp: a gradient sum over the data-parallel replicas.
        std::vector<float> grad = partials_of(rank, 100);
        CHILD_CHECK(g.dp->all_reduce_sum_deterministic(grad));
        out += "dp_sum=" + to_hex(grad) + "\n";
        // pp: activations forward from stage 0 to stage 1, gradients back.
        std::vector<float> act(64);
        if (l.is_first_stage(rank)) {
          act = partials_of(500 + rank, 64);
          CHILD_CHECK(g.pp->send(act, /*dst=*/1, /*tag=*/0));
          std::vector<float> back(64);
          CHILD_CHECK(g.pp->recv(back, /*src=*/1, /*tag=*/1));
          out += "grad_from=" + to_hex(back) + "\n";
        } else {
          CHILD_CHECK(g.pp->recv(act, /*src=*/0, /*tag=*/0));
          out += "act=" + to_hex(act) + "\n";
          for (auto& v : act) v *= 2.0f;
          CHILD_CHECK(g.pp->send(act, /*dst=*/0, /*tag=*/1));
        }
        CHILD_CHECK((*world)->barrier());
        out += "names=" + g.tp->name() + ";" + g.dp->name() + ";" + g.pp->name() + "\n";
        return out;
      },
      kRunDeadline);
  expect_all_ok(results);
  for (int r = 0; r < l.world_size(); ++r) {
    auto f = results[r].fields();
    const auto tp = l.tp_group(r), dp = l.dp_group(r), pp = l.pp_group(r);
    EXPECT_EQ(f["tp"], std::to_string(tp[0]) + "," + std::to_string(tp[1])) << "rank " << r;
    EXPECT_EQ(f["tp_rank"], std::to_string(l.coord(r).tp));
    std::vector<float> rows, sum(100);
    for (int m : dp) {
      const auto p = partials_of(m, 100);
      rows.insert(rows.end(), p.begin(), p.end());
    }
    halving_tree_sum(rows.data(), 2, 100, sum.data());
    EXPECT_EQ(f["dp_sum"], to_hex(sum)) << "rank " << r;
    if (l.is_first_stage(r)) {
      auto expected = partials_of(500 + r, 64);
      for (auto& v : expected) v *= 2.0f;
      EXPECT_EQ(f["grad_from"], to_hex(expected)) << "rank " << r;
    } else {
      EXPECT_EQ(f["act"], to_hex(partials_of(500 + pp[0], 64))) << "rank " << r;
    }
    EXPECT_EQ(f["names"], "tp[" + std::to_string(tp[0]) + "," + std::to_string(tp[1]) + "];dp[" +
                              std::to_string(dp[0]) + "," + std::to_string(dp[1]) + "];pp[" +
                              std::to_string(pp[0]) + "," + std::to_string(pp[1]) + "]");
  }
}

// Two ranks send each other a large message at the same time (a pipeline's activation one way,
// a gradient the other): with isend neither waits for the other to receive first. Then two
// isends to one peer in a row arrive in issue order.
void check_crossing_isends(bool shm) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        const CommOptions o = options_for(rank, 2, store.address(), "crossing");
        auto comm = shm ? connect_shm(o) : connect_gloo(o);
        if (!comm.ok()) return "error=" + comm.message();
        Communicator& c = **comm;
        const int peer = 1 - rank;
        const std::vector<float> mine = partials_of(600 + rank, 300'000);
        std::vector<float> theirs(300'000);
        auto pending = c.isend(mine.data(), mine.size() * sizeof(float), peer, 7);
        if (!pending.ok()) return "error=" + pending.message();
        CHILD_CHECK(c.recv(theirs, peer, 7));
        CHILD_CHECK((*pending)->wait());
        std::string out = "crossed=" + std::to_string(theirs == partials_of(600 + peer, 300'000));
        if (rank == 0) {
          const std::vector<float> a = partials_of(700, 90'000), b = partials_of(701, 90'000);
          auto pa = c.isend(a.data(), a.size() * sizeof(float), 1, 8);
          auto pb = c.isend(b.data(), b.size() * sizeof(float), 1, 9);
          if (!pa.ok() || !pb.ok()) return "error=isend";
          CHILD_CHECK((*pa)->wait());
          CHILD_CHECK((*pb)->wait());
        } else {
          std::vector<float> a(90'000), b(90'000);
          CHILD_CHECK(c.recv(a, 0, 8));
          CHILD_CHECK(c.recv(b, 0, 9));
          out += "\nin_order=" +
                 std::to_string(a == partials_of(700, 90'000) && b == partials_of(701, 90'000));
        }
        // Messages of one tag into several buffers posted at once (recv_buffers): each filled
        // with its own message, in order, an empty one included, then a later tag still matches.
        const std::vector<size_t> sizes = {1'200'000, 0, 7, 400'000};
        if (rank == 0) {
          std::vector<std::vector<float>> msgs;
          for (size_t i = 0; i < sizes.size(); ++i)
            msgs.push_back(partials_of(800 + static_cast<int>(i), sizes[i]));
          for (const auto& m : msgs) CHILD_CHECK(c.send(m.data(), m.size() * sizeof(float), 1, 11));
          CHILD_CHECK(c.send(partials_of(900, 5).data(), 5 * sizeof(float), 1, 12));
        } else {
          std::vector<std::vector<float>> got;
          std::vector<Communicator::Buffer> bufs;
          for (size_t n : sizes) got.emplace_back(n, -1.0f);
          for (auto& g : got) bufs.push_back({g.data(), g.size() * sizeof(float)});
          bool ok = true;
          size_t next = 0;
          CHILD_CHECK(c.recv_buffers(bufs, 0, 11, [&](size_t i) {
            ok &= i == next++ && got[i] == partials_of(800 + static_cast<int>(i), sizes[i]);
          }));
          std::vector<float> tail(5);
          CHILD_CHECK(c.recv(tail, 0, 12));
          ok &= next == sizes.size() && tail == partials_of(900, 5);
          out += "\nbuffers_in_order=" + std::to_string(ok);
        }
        CHILD_CHECK(c.barrier());
        return out;
      },
      kRunDeadline);
  expect_all_ok(results);
  EXPECT_EQ(results[0].fields()["crossed"], "1");
  EXPECT_EQ(results[1].fields()["crossed"], "1");
  EXPECT_EQ(results[1].fields()["in_order"], "1");
  EXPECT_EQ(results[1].fields()["buffers_in_order"], "1");
}

TEST(GlooCommunicator, CrossingIsendsOfLargeMessages) { check_crossing_isends(false); }
TEST(ShmCommunicator, CrossingIsendsOfLargeMessages) { check_crossing_isends(true); }

TEST(GlooCommunicator, ParallelGroupsOfDp2Pp2Tp2) { check_parallel_groups(false); }
TEST(ShmCommunicator, ParallelGroupsOfDp2Pp2Tp2) { check_parallel_groups(true); }

// ---- failures: errors within the timeout, never hangs ------------------------------------------

TEST(GlooCommunicator, PeerThatNeverJoinsIsAnErrorNamingIt) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  constexpr milliseconds kTimeout{1500};
  // A world of 3 where rank 2 never starts.
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, 3, store.address(), "missing");
        o.timeout = kTimeout;
        const auto t0 = std::chrono::steady_clock::now();
        auto comm = connect_gloo(o);
        const auto ms =
            std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
        return std::string("ok=") + (comm.ok() ? "1" : "0") + "\nmessage=" + comm.message() +
               "\nms=" + std::to_string(ms.count()) + "\n";
      },
      kRunDeadline);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].exited) << results[r].describe();
    auto f = results[r].fields();
    EXPECT_EQ(f["ok"], "0");
    std::printf("  rank %d: %s\n", r, f["message"].c_str());
    EXPECT_NE(f["message"].find("rank(s) 2 "), std::string::npos) << f["message"];
    EXPECT_NE(f["message"].find(store.address()), std::string::npos) << f["message"];
    EXPECT_NE(f["message"].find("did not join within 1500 ms"), std::string::npos) << f["message"];
    const int ms = std::stoi(f["ms"]);
    EXPECT_GE(ms, kTimeout.count() - 50);
    EXPECT_LT(ms, kTimeout.count() + 5000);
  }
}

TEST(GlooCommunicator, DeadOrSilentPeerIsAnErrorWithinTheTimeout) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  constexpr milliseconds kTimeout{1500};
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, 2, store.address(), "dead");
        o.timeout = kTimeout;
        auto comm = connect_gloo(o);
        if (!comm.ok()) return "error=" + comm.message();
        Communicator& c = **comm;
        CHILD_CHECK(c.barrier());
        if (rank == 1) {
          // Silent first: rank 0's recv of tag 9 times out. Then gone.
          std::this_thread::sleep_for(kTimeout + milliseconds(1000));
          _exit(0);
        }
        std::string out;
        std::vector<float> v(4);
        auto t0 = std::chrono::steady_clock::now();
        Status s = c.recv(v, 1, 9);
        auto ms = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
        out += std::string("recv_ok=") + (s.ok() ? "1" : "0") + "\nrecv_message=" + s.message() +
               "\nrecv_ms=" + std::to_string(ms.count()) + "\n";
        // The communicator is broken now: later calls fail at once.
        s = c.barrier();
        out += std::string("after_ok=") + (s.ok() ? "1" : "0") + "\nafter_message=" + s.message() +
               "\n";
        return out;
      },
      kRunDeadline);
  ASSERT_TRUE(results[0].exited) << results[0].describe();
  auto f = results[0].fields();
  EXPECT_EQ(f.count("error"), 0u) << f["error"];
  EXPECT_EQ(f["recv_ok"], "0");
  std::printf("  %s\n  %s\n", f["recv_message"].c_str(), f["after_message"].c_str());
  EXPECT_NE(f["recv_message"].find("recv from rank 1 (tag 9)"), std::string::npos)
      << f["recv_message"];
  EXPECT_NE(f["recv_message"].find("group world (rank 0 of 2)"), std::string::npos)
      << f["recv_message"];
  const int ms = std::stoi(f["recv_ms"]);
  EXPECT_GE(ms, kTimeout.count() - 50);
  EXPECT_LT(ms, kTimeout.count() + 5000);
  EXPECT_EQ(f["after_ok"], "0");
  EXPECT_NE(f["after_message"].find("failed earlier"), std::string::npos) << f["after_message"];
}

TEST(GlooCommunicator, PeerThatDiesMidCollectiveIsAnError) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  constexpr milliseconds kTimeout{3000};
  auto results = run_processes(
      3,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, 3, store.address(), "dies");
        o.timeout = kTimeout;
        auto comm = connect_gloo(o);
        if (!comm.ok()) return "error=" + comm.message();
        CHILD_CHECK((*comm)->barrier());
        if (rank == 2) _exit(0);  // gone: its sockets close
        std::vector<float> v = partials_of(rank, 1 << 16);
        auto t0 = std::chrono::steady_clock::now();
        Status s = (*comm)->all_reduce_sum_deterministic(v);
        auto ms = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
        return std::string("ok=") + (s.ok() ? "1" : "0") + "\nmessage=" + s.message() +
               "\nms=" + std::to_string(ms.count()) + "\n";
      },
      kRunDeadline);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].exited) << "rank " << r << ": " << results[r].describe();
    auto f = results[r].fields();
    EXPECT_EQ(f["ok"], "0") << "rank " << r;
    std::printf("  rank %d: %s\n", r, f["message"].c_str());
    EXPECT_NE(f["message"].find("gloo allgather in group world"), std::string::npos)
        << f["message"];
    EXPECT_LT(std::stoi(f["ms"]), kTimeout.count() + 5000);
  }
}

// A peer that dies in the middle of a large transfer: the sender gets an error (gloo writes with
// writev, so without connect_gloo ignoring SIGPIPE the sender would be killed instead).
TEST(GlooCommunicator, PeerThatDiesMidTransferIsAnErrorNotASignal) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  constexpr milliseconds kTimeout{2000};
  auto results = run_processes(
      2,
      [&](int rank) -> std::string {
        CommOptions o = options_for(rank, 2, store.address(), "midtransfer");
        o.timeout = kTimeout;
        auto comm = connect_gloo(o);
        if (!comm.ok()) return "error=" + comm.message();
        std::vector<float> big(size_t{64} << 20, 1.0f);  // 256 MiB: the transfer takes a while
        CHILD_CHECK((*comm)->barrier());
        if (rank == 1) {
          std::thread killer([] {
            std::this_thread::sleep_for(milliseconds(20));
            _exit(0);
          });
          killer.detach();
          (void)(*comm)->recv(big, 0, 5);
          _exit(0);
        }
        Status s = (*comm)->send(big, 1, 5);
        return std::string("ok=") + (s.ok() ? "1" : "0") + "\nmessage=" + s.message() + "\n";
      },
      kRunDeadline);
  ASSERT_TRUE(results[0].exited) << results[0].describe();
  auto f = results[0].fields();
  EXPECT_EQ(f["ok"], "0");
  EXPECT_NE(f["message"].find("gloo send to rank 1 (tag 5)"), std::string::npos) << f["message"];
  std::printf("  %s\n", f["message"].c_str());
}

// The NCCL back-end cannot run here (no GPU on the development machine): check only that asking for
// it without a GPU, or in a build without CUDA, is an error and not a crash. Run in a child so that
// the CUDA runtime never initializes in the test process (which forks later tests' ranks).
TEST(ConnectNccl, WithoutAGpuIsAnError) {
  StoreProcess store;
  ASSERT_TRUE(store.ok());
  auto results = run_processes(
      1,
      [&](int rank) -> std::string {
        auto comm = connect_nccl(options_for(0, 1, store.address(), "nccl"));
        return std::string("ok=") + (comm.ok() ? "1" : "0") + "\nmessage=" + comm.message() + "\n";
      },
      kRunDeadline);
  ASSERT_TRUE(results[0].exited) << results[0].describe();
  auto f = results[0].fields();
  if (f["ok"] == "1") GTEST_SKIP() << "a GPU is visible: connect_nccl succeeded";
  std::printf("  %s\n", f["message"].c_str());
  EXPECT_NE(f["message"].find("connect_nccl (rank 0"), std::string::npos) << f["message"];
}

}  // namespace
}  // namespace miles
