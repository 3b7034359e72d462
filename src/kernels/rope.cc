// Rotary position embedding: the inverse-frequency table of each HF rope type, and its application
// to half-split pairs (i, i + rotary_dim / 2) as HF's rotate_half. Float32 throughout, as torch
// computes it.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "miles/backward_kernels.h"
#include "miles/kernels.h"

namespace miles::kernels {

namespace {

std::vector<float> default_inv_freq(float base, int64_t dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(base, e);
  }
  return inv;
}

void apply_llama3(const RopeConfig& r, std::vector<float>& inv) {
  const float factor = static_cast<float>(r.factor);
  const float lo_f = static_cast<float>(r.low_freq_factor);
  const float hi_f = static_cast<float>(r.high_freq_factor);
  const float old_ctx = static_cast<float>(r.original_max_position_embeddings);
  const float low_wavelen = old_ctx / lo_f;
  const float high_wavelen = old_ctx / hi_f;
  for (float& f : inv) {
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const float smooth = (old_ctx / wavelen - lo_f) / (hi_f - lo_f);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos) {
  return (static_cast<double>(dim) * std::log(max_pos / (rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

void apply_yarn(const RopeConfig& r, float base, int64_t dim, std::vector<float>& inv,
                float& attention_scaling) {
  const double factor = r.factor;
  double attention_factor = r.attention_factor;
  if (attention_factor <= 0.0) {
    attention_factor = (r.mscale > 0.0 && r.mscale_all_dim > 0.0)
                           ? yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim)
                           : yarn_mscale(factor, 1.0);
  }
  attention_scaling = static_cast<float>(attention_factor);
  double orig = static_cast<double>(r.original_max_position_embeddings);
  if (orig <= 0) orig = static_cast<double>(r.max_position_embeddings);
  double low = yarn_correction_dim(r.beta_fast, dim, base, orig);
  double high = yarn_correction_dim(r.beta_slow, dim, base, orig);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float lo_f = static_cast<float>(low), range = static_cast<float>(high - low);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = std::pow(base, e);
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - lo_f) / range, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
}

// cos(angle) · s and sin(angle) · s of pair j at position pos: the table's cache and rotate use
// this one function, so a cached value is the computed one.
void cos_sin_at(const RopeTable& table, int64_t pos, int64_t j, float& c, float& sn) {
  const float angle = static_cast<float>(pos) * table.inv_freq[j];
  c = std::cos(angle) * table.attention_scaling;
  sn = std::sin(angle) * table.attention_scaling;
}

}  // namespace

Result<RopeTable> make_rope_table(const RopeConfig& rope, int64_t head_dim) {
  RopeTable t;
  t.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  if (t.rotary_dim <= 0 || t.rotary_dim % 2 != 0 || t.rotary_dim > head_dim)
    return Status::Error("rotary dimension " + std::to_string(t.rotary_dim) + " (head_dim " +
                         std::to_string(head_dim) +
                         " × partial_rotary_factor) must be even and in "
                         "(0, head_dim]");
  const float base = static_cast<float>(rope.theta);
  t.inv_freq = default_inv_freq(base, t.rotary_dim);
  switch (rope.type) {
    case RopeConfig::Type::kDefault:
      break;
    case RopeConfig::Type::kLinear:
      for (float& f : t.inv_freq) f = f / static_cast<float>(rope.factor);
      break;
    case RopeConfig::Type::kLlama3:
      apply_llama3(rope, t.inv_freq);
      break;
    case RopeConfig::Type::kYarn:
      apply_yarn(rope, base, t.rotary_dim, t.inv_freq, t.attention_scaling);
      break;
    case RopeConfig::Type::kDynamic:
      return Status::Error(
          "rope_type 'dynamic' is not supported: it changes a token's rotation with the sequence's "
          "current length, which breaks batch and chunked-prefill invariance");
  }
  // The cache (rotate's values for the first kCachedPositions positions): 1 MB for a head
  // dimension of 64, a few milliseconds to fill.
  constexpr int64_t kCachedPositions = 4096;
  const int64_t half = t.rotary_dim / 2;
  t.cos_sin.resize(static_cast<size_t>(kCachedPositions * 2 * half));
  for (int64_t pos = 0; pos < kCachedPositions; ++pos)
    for (int64_t j = 0; j < half; ++j) {
      float* row = t.cos_sin.data() + pos * 2 * half;
      cos_sin_at(t, pos, j, row[j], row[half + j]);
    }
  t.cached_positions = kCachedPositions;
  return t;
}

namespace {
// Rotates pairs (i, i + rotary_dim / 2) of every head by +angle, or by −angle for the backward (Rᵀ
// is the rotation by −angle: sin negated, which is exact).
void rotate(float* x, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
            const RopeTable& table, bool inverse) {
  const int64_t half = table.rotary_dim / 2;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t pos = positions[i];
    const float* cached =
        pos >= 0 && pos < table.cached_positions ? table.cos_sin.data() + pos * 2 * half : nullptr;
    for (int64_t j = 0; j < half; ++j) {
      float c, sn;
      if (cached) {
        c = cached[j];
        sn = cached[half + j];
      } else {
        cos_sin_at(table, pos, j, c, sn);
      }
      if (inverse) sn = -sn;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (i * heads + h) * head_dim;
        const float a = v[j], b = v[j + half];
        v[j] = a * c - b * sn;
        v[j + half] = b * c + a * sn;
      }
    }
  }
}
}  // namespace

void rope_apply(float* x, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
                const RopeTable& table) {
  rotate(x, t, heads, head_dim, positions, table, false);
}

void rope_backward(float* dx, int64_t t, int64_t heads, int64_t head_dim, const int32_t* positions,
                   const RopeTable& table) {
  rotate(dx, t, heads, head_dim, positions, table, true);
}

}  // namespace miles::kernels
