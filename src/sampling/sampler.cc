// sample_token: temperature, then SGLang's filter order top-k -> top-p -> min-p, then an
// inverse-CDF draw with the counter-based uniform of (seed, step).
//
// Why this shape: every phase is a named function over one row so that a batched or GPU sampler can
// be checked against it phase by phase. Determinism: candidates are ordered by (probability desc,
// id asc), a strict total order, so any sort gives the same list; the sums of kept mass and of the
// CDF run in that list's order, in double. Normalisation uses the batch-invariant kernels
// (softmax_row, log_softmax_row), so the logprobs here are the bits the trainer's kernels compute
// for the same logits.
#include "miles/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "miles/check.h"
#include "miles/kernels.h"
#include "sampling/philox.h"

namespace miles {
namespace {

std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

// Logits must be numbers a softmax can normalise: no NaN, no +inf, at least one finite value.
void check_logits(std::span<const float> logits) {
  MILES_CHECK(!logits.empty(), "sample_token needs at least one logit");
  MILES_CHECK(logits.size() <= static_cast<size_t>(INT32_MAX),
              "vocabulary too large for int32 ids");
  bool any_finite = false;
  for (const float x : logits) {
    MILES_CHECK(!std::isnan(x) && x != INFINITY, "logits hold NaN or +inf");
    any_finite = any_finite || std::isfinite(x);
  }
  MILES_CHECK(any_finite, "every logit is -inf: no token can be sampled");
}

// Index of the largest value, the lowest index among equals.
int32_t argmax(std::span<const float> x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[best]) best = static_cast<int32_t>(i);
  return best;
}

// The tokens that survive top-k, top-p and min-p (SGLang's order: top_k -> top_p -> min_p, all on
// the tempered probabilities). Most likely first when top-k or top-p is on; otherwise in id order
// (no filter needs an order then, and sorting the whole vocabulary would cost time for nothing).
std::vector<int32_t> kept_tokens(const std::vector<float>& probs, const SamplingParams& params) {
  const int64_t n = static_cast<int64_t>(probs.size());
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto more_likely = [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  };
  const bool sorted = params.top_k > 0 || params.top_p < 1.0f;
  if (sorted) {
    const int64_t k = params.top_k > 0 ? std::min<int64_t>(params.top_k, n) : n;
    if (k < n) {
      std::partial_sort(order.begin(), order.begin() + k, order.end(), more_likely);
      order.resize(k);
    } else {
      std::sort(order.begin(), order.end(), more_likely);
    }
  }
  if (params.top_p < 1.0f) {  // smallest prefix whose share of the top-k mass reaches top_p
    double mass = 0.0;
    for (const int32_t id : order) mass += probs[id];
    const double target = static_cast<double>(params.top_p) * mass;
    double cum = 0.0;
    size_t keep = order.size();
    for (size_t i = 0; i < order.size(); ++i) {
      cum += probs[order[i]];
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    order.resize(keep);
  }
  if (params.min_p > 0.0f) {  // the most likely token always passes (min_p < 1)
    const float p_max = sorted ? probs[order[0]] : *std::max_element(probs.begin(), probs.end());
    const double threshold = static_cast<double>(params.min_p) * p_max;
    std::erase_if(order, [&](int32_t id) { return probs[id] < threshold; });
  }
  MILES_CHECK(!order.empty());
  return order;
}

// Inverse CDF over the kept tokens in their order (id_at(i), i < count): the first token whose
// cumulative mass exceeds u * total. Sets `kept_mass` to the total.
template <typename IdAt>
int32_t draw(int64_t count, IdAt id_at, const std::vector<float>& probs, double u,
             double* kept_mass) {
  double mass = 0.0;
  for (int64_t i = 0; i < count; ++i) mass += probs[id_at(i)];
  *kept_mass = mass;
  const double target = u * mass;
  double cum = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    cum += probs[id_at(i)];
    if (cum > target) return id_at(i);
  }
  // u * mass rounded up to mass: the last token with any mass (the first kept one has mass > 0).
  for (int64_t i = count - 1; i >= 0; --i)
    if (probs[id_at(i)] > 0.0f) return id_at(i);
  MILES_CHECK(false, "no kept token has probability > 0");
  return -1;
}

}  // namespace

Status SamplingParams::validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0.0f))
    return Status::Error(
        "SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got " +
        num(temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return Status::Error("SamplingParams.top_p must be in (0, 1] (1 = off), got " + num(top_p));
  if (top_k < 0)
    return Status::Error("SamplingParams.top_k must be >= 0 (0 = off), got " +
                         std::to_string(top_k));
  if (!(min_p >= 0.0f && min_p < 1.0f))
    return Status::Error("SamplingParams.min_p must be in [0, 1) (0 = off), got " + num(min_p));
  return Status::Ok();
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  const sampling::PhiloxCounter w = sampling::philox4x32_10(
      {static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32), 0u, 0u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (static_cast<uint64_t>(w[1]) << 32) | w[0];
  return static_cast<double>(bits >> 11) * 0x1p-53;
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          uint64_t step) {
  MILES_CHECK(params.validate().ok(), "sample_token called with invalid SamplingParams");
  check_logits(logits);
  const int64_t n = static_cast<int64_t>(logits.size());
  if (params.greedy()) {
    const int32_t token = argmax(logits);
    const float raw = kernels::log_softmax_at(logits.data(), n, token);
    return {token, 0.0f, raw, raw};
  }

  // logits / 1 is logits itself: the tempered row is the raw one then.
  std::vector<float> scaled;  // (vocab) logits / temperature
  const float* tempered = logits.data();
  if (params.temperature != 1.0f) {
    scaled.resize(n);
    for (int64_t i = 0; i < n; ++i) scaled[i] = logits[i] / params.temperature;
    tempered = scaled.data();
  }
  std::vector<float> logp(n), probs(n);  // (vocab) log_softmax(scaled), softmax(scaled)
  kernels::softmax_log_softmax_row(tempered, n, probs.data(), logp.data());

  // No filter on: every id is kept, in id order, and the draw walks the ids themselves.
  const bool filtered = params.top_k > 0 || params.top_p < 1.0f || params.min_p > 0.0f;
  const std::vector<int32_t> kept = filtered ? kept_tokens(probs, params) : std::vector<int32_t>();
  const double u = sampling_uniform(params.seed, step);
  double kept_mass = 0.0;
  const int32_t token =
      filtered ? draw(
                     static_cast<int64_t>(kept.size()), [&](int64_t i) { return kept[i]; }, probs,
                     u, &kept_mass)
               : draw(
                     n, [](int64_t i) { return static_cast<int32_t>(i); }, probs, u, &kept_mass);
  // Nothing filtered: the tempered log-softmax itself (renormalising by a mass of 1 ± rounding
  // would only add error).
  const float logprob =
      !filtered || static_cast<int64_t>(kept.size()) == n
          ? logp[token]
          : static_cast<float>(static_cast<double>(logp[token]) - std::log(kept_mass));
  const float raw_logprob =
      tempered == logits.data() ? logp[token] : kernels::log_softmax_at(logits.data(), n, token);
  return {token, logprob, raw_logprob, logp[token]};
}

namespace {

// log_softmax of the row sample_token normalises: logits / temperature (logits themselves for
// temperature 1 and for greedy requests), through the same kernels.
std::vector<float> tempered_log_softmax(std::span<const float> logits,
                                        const SamplingParams& params) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<float> logp(n);
  if (params.greedy() || params.temperature == 1.0f) {
    kernels::log_softmax_row(logits.data(), n, logp.data());
    return logp;
  }
  std::vector<float> scaled(n), probs(n);
  for (int64_t i = 0; i < n; ++i) scaled[i] = logits[i] / params.temperature;
  kernels::softmax_log_softmax_row(scaled.data(), n, probs.data(), logp.data());
  return logp;
}

}  // namespace

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, const SamplingParams& params,
                                       int32_t count) {
  MILES_CHECK(params.validate().ok(), "top_logprobs called with invalid SamplingParams");
  check_logits(logits);
  const std::vector<float> logp = tempered_log_softmax(logits, params);
  const int64_t n = static_cast<int64_t>(logp.size());
  const int64_t k = std::clamp<int64_t>(count, 0, n);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logp[a] > logp[b] || (logp[a] == logp[b] && a < b);
  });
  std::vector<TokenLogprob> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = {order[i], logp[order[i]]};
  return out;
}

std::vector<float> token_logprobs(std::span<const float> logits, const SamplingParams& params,
                                  std::span<const int32_t> ids) {
  MILES_CHECK(params.validate().ok(), "token_logprobs called with invalid SamplingParams");
  check_logits(logits);
  if (ids.empty()) return {};
  const std::vector<float> logp = tempered_log_softmax(logits, params);
  std::vector<float> out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    MILES_CHECK(id >= 0 && static_cast<size_t>(id) < logp.size(),
                "token id outside the vocabulary");
    out.push_back(logp[static_cast<size_t>(id)]);
  }
  return out;
}

float tempered_logprob(std::span<const float> logits, const SamplingParams& params, int32_t token) {
  MILES_CHECK(params.validate().ok(), "tempered_logprob called with invalid SamplingParams");
  check_logits(logits);
  MILES_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size());
  if (params.greedy() || params.temperature == 1.0f)
    return kernels::log_softmax_at(logits.data(), static_cast<int64_t>(logits.size()), token);
  return tempered_log_softmax(logits, params)[token];
}

}  // namespace miles
