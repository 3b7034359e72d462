// miles_device_check: the device forward against the CPU model on a machine with a GPU, bit for
// bit, then its speed. Needs only miles' core (no gRPC, Gloo or gtest), so that it builds on a bare
// GPU machine from tests/device/CMakeLists.txt (scripts/device_check.sh); the main build compiles
// it too, so it cannot rot.
//
//   miles_device_check [--device cuda|emulated] [--time] [--train] MODEL...
//
// For each MODEL (an HF directory or llama2.c file; "smollm2-shape" and "qwen3-0.6b-shape" are
// random-weight models of those shapes): two sequences prefilled together into scattered KV blocks,
// then both decoded one token; the device's logits must equal the CPU model's in every bit. With
// --train: a packed training batch through forward_train and backward, every gradient equal to the
// CPU Model::backward's. With --time: prefill, decode and (with --train) training-pass throughput
// on the device against the CPU (all cores). Exit status 0 only when every model matched.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "miles/device_model.h"
#include "miles/flat_params.h"
#include "miles/model.h"
#include "miles/thread_pool.h"

namespace miles {
namespace {

ModelConfig shaped(const std::string& name) {
  ModelConfig c;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  if (name == "smollm2-shape") {  // SmolLM2-135M
    c.arch_name = "LlamaForCausalLM";
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_layers = 30;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.tie_word_embeddings = true;
    c.rope.theta = 100000;
  } else {  // Qwen3-0.6B
    c.arch_name = "Qwen3ForCausalLM";
    c.vocab_size = 151936;
    c.hidden_size = 1024;
    c.intermediate_size = 3072;
    c.num_layers = 28;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.tie_word_embeddings = true;
    c.rope.theta = 1000000;
  }
  return c;
}

Result<ModelFiles> load(const std::string& spec) {
  if (spec != "smollm2-shape" && spec != "qwen3-0.6b-shape") return load_model_files(spec);
  ModelFiles f;
  f.config = shaped(spec);
  auto layout = ParamLayout::for_model(f.config);
  auto values = std::make_shared<FlatTensors>(layout);
  std::mt19937 rng(1);
  for (float& x : values->all()) x = (static_cast<float>(rng() % 2001) - 1000.0f) * 5e-5f;
  f.weights = values->as_tensor_map();
  // The views point into `values`: keep it alive as long as the process (a check tool).
  static std::vector<std::shared_ptr<FlatTensors>> keep;
  keep.push_back(values);
  return f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  if (a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0) return true;
  double worst = 0;
  size_t first = a.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0 && first == a.size()) first = i;
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  std::printf("    %s: DIFFER (sizes %zu / %zu, first differing index %zu, max |diff| %.3g)\n",
              what, a.size(), b.size(), first, worst);
  return false;
}

// A packed batch of `seqs` sequences of `len` tokens through the training forward and backward on
// both sides: logits and every gradient compared bit for bit; the times of each side when `time`.
bool check_training(const ModelFiles& files, const Model& cpu, DeviceModel& dev, int64_t seqs_n,
                    int64_t len, bool time, ThreadPool& pool) {
  const ModelConfig& c = files.config;
  std::mt19937 rng(9);
  std::vector<int32_t> tokens(seqs_n * len);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.vocab_size);
  std::vector<SeqSpan> seqs;
  for (int64_t s = 0; s < seqs_n; ++s) seqs.push_back({static_cast<int32_t>(s), 0, len});
  auto cache = cpu.make_kv_cache();
  ForwardTape tape;
  ForwardOptions o;
  o.tape = &tape;
  auto t0 = std::chrono::steady_clock::now();
  auto a = cpu.forward(tokens, seqs, *cache, o, &pool);
  if (!a.ok()) {
    std::printf("    cpu training forward: %s\n", a.message().c_str());
    return false;
  }
  std::vector<float> dlogits(a->logits.size());
  std::normal_distribution<float> nd(0.0f, 1e-4f);
  for (float& x : dlogits) x = nd(rng);
  auto layout = ParamLayout::for_model(c, &files.weights);
  FlatTensors ga(layout), gb(layout);
  if (Status s = cpu.backward(tape, dlogits, ga, &pool); !s.ok()) {
    std::printf("    cpu backward: %s\n", s.message().c_str());
    return false;
  }
  const double cpu_s = seconds_since(t0);
  double dev_s = 1e30;
  bool ok = true;
  for (int rep = 0; rep < (time ? 3 : 1); ++rep) {
    t0 = std::chrono::steady_clock::now();
    auto b = dev.forward_train(tokens, seqs, true);
    Status s = b.ok() ? dev.backward(dlogits, gb, {}) : b.status();
    if (!s.ok()) {
      std::printf("    device training pass: %s\n", s.message().c_str());
      return false;
    }
    dev_s = std::min(dev_s, seconds_since(t0));
    if (rep == 0) {
      ok = same_bits(a->logits, b->logits, "training logits") && ok;
      int bad = 0;
      for (const ParamSpec& spec : layout->specs()) {
        const auto x = ga.get(spec.name), y = gb.get(spec.name);
        if (std::memcmp(x.data(), y.data(), 4 * x.size()) != 0 && bad++ < 3)
          std::printf("    gradient of %s: DIFFERS\n", spec.name.c_str());
      }
      ok = ok && bad == 0;
      std::printf("    training (%lld x %lld tokens): logits and %zu gradients %s\n",
                  static_cast<long long>(seqs_n), static_cast<long long>(len),
                  layout->specs().size(), ok ? "EQUAL to the CPU model's" : "NOT equal");
    }
  }
  if (time)
    std::printf(
        "    forward + backward of %lld tokens: %s %.4f s (%.0f tok/s), CPU %d threads "
        "%.4f s: %.1fx\n",
        static_cast<long long>(seqs_n * len), device_name(dev.device()), dev_s,
        seqs_n * len / dev_s, pool.num_threads(), cpu_s, cpu_s / dev_s);
  return ok;
}

// The bit-for-bit check of one model; its load and forward times when `time` is set.
bool check_model(const std::string& spec, Device device, bool time, bool train, ThreadPool& pool) {
  std::printf("%s\n", spec.c_str());
  auto files = load(spec);
  if (!files.ok()) {
    std::printf("    load: %s\n", files.message().c_str());
    return false;
  }
  const ModelConfig& c = files->config;
  auto cpu = Model::from_weights(c, files->weights);
  if (!cpu.ok()) {
    std::printf("    cpu model: %s\n", cpu.message().c_str());
    return false;
  }
  const int64_t bt = 16, blocks = 512;
  auto t0 = std::chrono::steady_clock::now();
  auto dev = make_device_model(device, c, files->weights, {blocks, bt}, &pool);
  if (!dev.ok()) {
    std::printf("    device model: %s\n", dev.message().c_str());
    return false;
  }
  std::printf("    loaded on %s in %.2f s: weights %.1f MB, KV pool %.1f MB\n", device_name(device),
              seconds_since(t0), (*dev)->weight_bytes() / 1e6, (*dev)->kv_bytes() / 1e6);
  // Two sequences over scattered blocks, prefilled together (every logit), then one decode each.
  std::mt19937 rng(3);
  const int64_t n0 = 37, n1 = 70;
  std::vector<int32_t> prefill(n0 + n1);
  for (auto& t : prefill) t = static_cast<int32_t>(rng() % c.vocab_size);
  const std::vector<SeqSpan> seqs = {{0, 0, n0}, {1, 0, n1}};
  const std::vector<int32_t> table0 = {40, 3, 17}, table1 = {8, 100, 2, 77, 5};
  auto cache = (*cpu)->make_kv_cache(bt);
  const bool moe = c.num_moe_layers() > 0;
  ForwardOptions o;
  o.return_experts = moe;
  auto a = (*cpu)->forward(prefill, seqs, *cache, o, &pool);
  auto b = (*dev)->forward(DeviceBatch{prefill, seqs, {table0, table1}, true, moe});
  if (!a.ok() || !b.ok()) {
    std::printf("    prefill: %s\n", (a.ok() ? b.message() : a.message()).c_str());
    return false;
  }
  bool ok = same_bits(a->logits, b->logits, "prefill logits");
  if (a->experts != b->experts) {
    std::printf("    routed experts: DIFFER\n");
    ok = false;
  }
  const std::vector<int32_t> next = {static_cast<int32_t>(rng() % c.vocab_size),
                                     static_cast<int32_t>(rng() % c.vocab_size)};
  const std::vector<SeqSpan> dec = {{1, n1, 1}, {0, n0, 1}};
  o.all_logits = false;
  a = (*cpu)->forward(next, dec, *cache, o, &pool);
  b = (*dev)->forward(DeviceBatch{next, dec, {table1, table0}, false, moe});
  if (!a.ok() || !b.ok()) {
    std::printf("    decode: %s\n", (a.ok() ? b.message() : a.message()).c_str());
    return false;
  }
  ok = same_bits(a->logits, b->logits, "decode logits") && ok;
  std::printf("    bits: %s\n", ok ? "EQUAL to the CPU model (prefill and decode)" : "NOT equal");
  if (train) ok = check_training(*files, **cpu, **dev, 2, time ? 128 : 70, time, pool) && ok;
  if (!time) return ok;

  // Throughput: a prefill of 4 x 128 tokens, then decode steps of 64 sequences at context 128
  // (sizes that the first, simple device kernels finish in seconds).
  const int64_t seq = 128, nseq = 4, batch = 64;
  std::vector<int32_t> toks(seq * nseq);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % c.vocab_size);
  std::vector<SeqSpan> ps;
  std::vector<std::vector<int32_t>> tabs;
  for (int64_t s = 0; s < nseq; ++s) {
    ps.push_back({static_cast<int32_t>(10 + s), 0, seq});
    std::vector<int32_t> t;
    for (int64_t k = 0; k < (seq + bt) / bt; ++k) t.push_back(static_cast<int32_t>(s * 20 + k));
    tabs.push_back(t);
  }
  DeviceBatch pb{toks, ps, {}, false};
  for (auto& t : tabs) pb.tables.emplace_back(t);
  auto run_dev = [&](const DeviceBatch& batch_in, int reps) {
    std::vector<double> ts;
    for (int r = 0; r < reps; ++r) {
      auto t = std::chrono::steady_clock::now();
      auto out = (*dev)->forward(batch_in);
      if (!out.ok()) std::printf("    timed forward: %s\n", out.message().c_str());
      ts.push_back(seconds_since(t));
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };
  (void)run_dev(pb, 1);  // warm-up (module load)
  const double dev_prefill = run_dev(pb, 5);
  auto cpu_cache = (*cpu)->make_kv_cache(bt);
  t0 = std::chrono::steady_clock::now();
  (void)(*cpu)->forward(toks, ps, *cpu_cache, o, &pool);
  const double cpu_prefill = seconds_since(t0);
  // Decode: `batch` sequences of context `seq` (the 4 prefilled ones' blocks, shared as a radix
  // cache would), one new token each, each in its own next block.
  std::vector<int32_t> dt(batch);
  std::vector<SeqSpan> ds;
  std::vector<std::vector<int32_t>> dtabs;
  for (int64_t s = 0; s < batch; ++s) {
    dt[s] = static_cast<int32_t>(rng() % c.vocab_size);
    ds.push_back({static_cast<int32_t>(s), seq, 1});
    std::vector<int32_t> t(tabs[s % nseq].begin(), tabs[s % nseq].begin() + seq / bt);
    t.push_back(static_cast<int32_t>(200 + s));
    dtabs.push_back(t);
  }
  DeviceBatch db{dt, ds, {}, false};
  for (auto& t : dtabs) db.tables.emplace_back(t);
  const double dev_decode = run_dev(db, 10);
  std::printf("    prefill %lld tokens: %s %.4f s (%.0f tok/s), CPU %d threads %.4f s: %.1fx\n",
              static_cast<long long>(seq * nseq), device_name(device), dev_prefill,
              seq * nseq / dev_prefill, pool.num_threads(), cpu_prefill, cpu_prefill / dev_prefill);
  std::printf("    decode step, %lld sequences at context %lld: %.4f s (%.0f tok/s)\n",
              static_cast<long long>(batch), static_cast<long long>(seq), dev_decode,
              batch / dev_decode);
  return ok;
}

}  // namespace
}  // namespace miles

int main(int argc, char** argv) {
  using namespace miles;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once (a timeout keeps the log)
  Device device = Device::kCuda;
  bool time = false, train = false;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) {
      auto d = parse_device(argv[++i]);
      if (!d.ok() || *d == Device::kCpu) {
        std::fprintf(stderr, "miles_device_check: --device cuda or emulated\n");
        return 2;
      }
      device = *d;
    } else if (a == "--time") {
      time = true;
    } else if (a == "--train") {
      train = true;
    } else {
      models.push_back(a);
    }
  }
  if (models.empty()) {
    std::fprintf(
        stderr, "usage: miles_device_check [--device cuda|emulated] [--time] [--train] MODEL...\n");
    return 2;
  }
  if (device == Device::kCuda) {
    if (Status s = cuda_available(); !s.ok()) {
      std::printf("no GPU: %s\n", s.message().c_str());
      return 1;
    }
  }
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  int failed = 0;
  for (const std::string& m : models) failed += check_model(m, device, time, train, pool) ? 0 : 1;
  std::printf("%s: %zu model(s), %d not equal to the CPU model\n", failed ? "FAIL" : "PASS",
              models.size(), failed);
  return failed ? 1 : 0;
}
