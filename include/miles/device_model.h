// DeviceModel: the shared model's inference forward on an accelerator, with the KV cache in the
// accelerator's memory, computing the CPU Model's bits.
//
// Why: true on-policy RL needs the rollout engine and the trainer to agree bit for bit wherever
// each runs. The device kernels (src/device) follow the CPU kernels' numerics contract operation
// for operation (kernels.h), so a GPU engine's logits equal the CPU model's: a GPU rollout can feed
// a CPU trainer, and the CPU tests pin the GPU's numbers. Devices:
//   cpu       the CPU Model (make_model_runner); not a DeviceModel
//   cuda      CUDA kernels on the first visible GPU (a build with MILES_HAVE_CUDA)
//   emulated  the very device kernels run as host loops: how the CPU-only test suite checks the
//             device path (indexing, KV paging, every kernel's bits) without a GPU
// Every family the CPU model runs (the MoE ones with their routed experts for R3): inference and
// training passes (with routing replay).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/model.h"

namespace miles {

class ThreadPool;
class FlatTensors;

enum class Device { kCpu, kCuda, kEmulated };
const char* device_name(Device d);
// Every device's name, in the enum's order: what --device options and config keys accept.
const std::vector<std::string>& device_names();
// "cpu", "cuda" or "emulated"; anything else is an error naming the choices.
Result<Device> parse_device(const std::string& name);
// Ok when this build has the CUDA backend and a GPU can be used; else why not.
Status cuda_available();

// One forward of a packed batch: `seqs` as Model::forward's, each with its block table (the KV
// blocks holding positions 0 .. start_pos + n_tokens - 1, block_tokens positions per block).
struct DeviceBatch {
  std::span<const int32_t> tokens;
  std::span<const SeqSpan> seqs;
  std::vector<std::span<const int32_t>> tables;
  bool all_logits = true;
  // MoE models: the routed experts of every token and MoE layer into ForwardOutput::experts and
  // expert_weights ([T, moe_layers, top_k]; R3 capture).
  bool return_experts = false;
  std::span<const int64_t> last_rows;   // as ForwardOptions::last_rows
  std::span<const int64_t> logit_rows;  // as ForwardOptions::logit_rows
  // The last layer's output before the final norm ([T, hidden]) into ForwardOutput::hidden, as
  // ForwardOptions::return_hidden (the co-trained draft head's features).
  bool return_hidden = false;
  std::span<const int64_t> tap_layers;  // as ForwardOptions::tap_layers (ForwardOutput::taps)
};

struct DeviceKvGeometry {
  int64_t num_blocks = 0;
  int64_t block_tokens = 16;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  virtual Device device() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Logits ([rows, vocab]: every token's, or each sequence's last), computed on the device and
  // copied back; keys and values written into the device KV blocks of the tables.
  virtual Result<ForwardOutput> forward(const DeviceBatch& batch) = 0;
  // Every layer's keys and values of block src copied to block dst (a GRPO sibling's partial
  // prompt block); the first `positions` are what the caller relies on.
  virtual Status copy_kv_block(int32_t src, int32_t dst, int64_t positions) = 0;
  // A model over new full weights (HF names, this config's shapes) sharing this one's KV blocks.
  virtual Result<std::unique_ptr<DeviceModel>> with_weights(const TensorMap& weights) const = 0;
  // New values of the same tensors into this model's device buffers (the trainer's per-step
  // update). On an error the model must not be used.
  virtual Status reload_weights(const TensorMap& weights) = 0;

  // Training (the trainer's micro-step on the device): whole sequences from position 0, every
  // token's logits ([T, vocab], Model::forward's bits; a MoE model's routed experts too), or those
  // of logit_rows only (as ForwardOptions::logit_rows); with keep_tape the activations stay on the
  // device for backward(), until the next forward_train. forced_experts: routing replay (R3),
  // [T, moe_layers, top_k] ids as ForwardOptions'. tap_layers: those layers' outputs too, in
  // ForwardOutput::taps (the co-trained draft head's features, as ForwardOptions::tap_layers).
  virtual Result<ForwardOutput> forward_train(std::span<const int32_t> tokens,
                                              std::span<const SeqSpan> seqs, bool keep_tape,
                                              std::span<const int32_t> forced_experts = {},
                                              std::span<const int64_t> logit_rows = {},
                                              std::span<const int64_t> tap_layers = {}) = 0;
  // Model::backward's gradients (its bits) from d loss / d logits (of the rows forward_train
  // computed) of the kept tape: every tensor
  // of `grads` (ParamLayout::for_model's layout) overwritten; a tied model's head share goes to
  // tied_head_grad when given (vocab × hidden), else into the embedding's gradient.
  virtual Status backward(std::span<const float> dlogits, FlatTensors& grads,
                          std::span<float> tied_head_grad) = 0;
  // Bytes of device memory this model's weights and the shared KV pool hold.
  virtual int64_t weight_bytes() const = 0;
  virtual int64_t kv_bytes() const = 0;
};

// Whether the device forward runs a model of this config (head_dim within the device kernels'
// bound). Errors say what is not supported.
Status device_supports(const ModelConfig& config);
// Before engines on `device` (a name, parse_device's) start: the name, the model's support, and
// for cuda a usable GPU. Ok for cpu.
Status check_device_engines(const std::string& device, const ModelConfig& config);

// Loads `weights` onto `device` (kCuda or kEmulated) with a KV pool of kv.num_blocks blocks.
// host_pool: threads for the host-side conversion and for kEmulated's kernel loops (may be null).
Result<std::unique_ptr<DeviceModel>> make_device_model(Device device, const ModelConfig& config,
                                                       const TensorMap& weights,
                                                       const DeviceKvGeometry& kv,
                                                       ThreadPool* host_pool);

}  // namespace miles
