// Batch layout validation and reduction weights shared by the RL loss files (see rl_common.h).
#include "trainer/rl_common.h"

#include <cmath>

namespace miles::rl::detail {

Status check_layout(std::span<const int64_t> offsets, std::span<const float> loss_mask) {
  if (offsets.size() < 2) return Status::Error("offsets: need at least one sample (2 entries)");
  if (offsets[0] != 0) return Status::Error("offsets: offsets[0] must be 0");
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    if (offsets[s + 1] < offsets[s]) {
      return Status::Error("offsets: decreasing at sample " + std::to_string(s));
    }
  }
  const auto num_tokens = static_cast<size_t>(offsets.back());
  if (loss_mask.size() != num_tokens) {
    return Status::Error("loss_mask: has " + std::to_string(loss_mask.size()) +
                         " entries, offsets.back() is " + std::to_string(num_tokens));
  }
  bool any = false;
  for (size_t t = 0; t < num_tokens; ++t) {
    if (loss_mask[t] != 0.0f && loss_mask[t] != 1.0f) {
      return Status::Error("loss_mask: entry " + std::to_string(t) + " is neither 0 nor 1");
    }
    any = any || loss_mask[t] == 1.0f;
  }
  if (!any) return Status::Error("loss_mask: no token has loss_mask 1 (empty mask)");
  return Status::Ok();
}

Status check_array(const char* name, std::span<const float> values, size_t num_tokens,
                   bool required) {
  if (values.empty() && !required) return Status::Ok();
  if (values.size() != num_tokens) {
    return Status::Error(std::string(name) + ": has " + std::to_string(values.size()) +
                         " entries, expected " + std::to_string(num_tokens) + " (offsets.back())");
  }
  for (size_t t = 0; t < num_tokens; ++t) {
    if (!std::isfinite(values[t])) {
      return Status::Error(std::string(name) + ": entry " + std::to_string(t) + " is not finite");
    }
  }
  return Status::Ok();
}

int64_t masked_count(std::span<const int64_t> offsets, std::span<const float> loss_mask, size_t s) {
  int64_t n = 0;
  for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) n += loss_mask[t] == 1.0f ? 1 : 0;
  return n;
}

Result<std::vector<double>> reduction_weights(const LossConfig& config,
                                              std::span<const int64_t> offsets,
                                              std::span<const float> loss_mask) {
  const size_t num_samples = offsets.size() - 1;
  std::vector<double> rho(loss_mask.size(), 0.0);
  switch (config.reduction) {
    case LossReduction::kTokenMean: {
      double denom = config.token_normaliser;
      if (denom <= 0) {
        denom = 0;
        for (float m : loss_mask) denom += m;
      }
      // No token to train (every sample masked, e.g. all failed): the weights are all 0.
      for (size_t t = 0; t < rho.size(); ++t) rho[t] = denom > 0 ? loss_mask[t] / denom : 0.0;
      break;
    }
    case LossReduction::kSampleMean: {
      const double samples = config.sample_normaliser > 0 ? config.sample_normaliser
                                                          : static_cast<double>(num_samples);
      for (size_t s = 0; s < num_samples; ++s) {
        const int64_t n = masked_count(offsets, loss_mask, s);
        const double w = 1.0 / (static_cast<double>(n > 0 ? n : 1) * samples);
        for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) rho[t] = loss_mask[t] * w;
      }
      break;
    }
    case LossReduction::kConstant: {
      if (!(config.constant_normaliser > 0)) {
        return Status::Error("constant_normaliser: must be > 0 for reduction kConstant");
      }
      for (size_t t = 0; t < rho.size(); ++t) rho[t] = loss_mask[t] / config.constant_normaliser;
      break;
    }
  }
  return rho;
}

}  // namespace miles::rl::detail
