// Policy losses (PPO clip with clip-higher and dual clip, GSPO), KL to the reference model, entropy
// bonus, their reduction and the gradient of the total loss with respect to logp and entropy; and
// the SFT negative log-likelihood with the same reductions.
//
// Conventions (learned from slime's compute_policy_loss / compute_approx_kl / compute_gspo_kl and
// the GSPO paper, re-derived here; see docs in include/miles/trainer/rl_loss.h):
//  - surrogate: l = max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A); with dual clip c, for A < 0,
//    l = min(-c A, that). clipfrac counts tokens with -clip(r) A > -r A strictly, so at r == 1 it
//    is 0.
//  - d l / d r is -A on the unclipped branch and 0 where a clip is taken. At exact ties torch's
//  max/min
//    split the gradient in halves; both halves are equal except in measure-zero cases, where we
//    take the unclipped branch.
//  - GSPO: r_s = exp(sum_{t in s} m_t (logp_t - old_t) / max(n_s, 1)), the same surrogate per token
//  with
//    r_s, gradient d r_s / d logp_j = r_s m_j / n_s (it flows to every masked token of the sample).
//  - KL, x = logp - ref: k1 = x, k2 = x^2 / 2, k3 = exp(-x) + x - 1.
//  - loss = pg_loss + kl_coef kl_loss - entropy_coef entropy_loss (slime's sign convention).
#include <algorithm>
#include <cmath>
#include <utility>

#include "miles/trainer/rl_loss.h"
#include "trainer/rl_common.h"

namespace miles::rl {

Status LossConfig::validate() const {
  if (!(eps_low >= 0 && eps_low < 1)) return Status::Error("eps_low: must be in [0, 1)");
  if (!(eps_high >= 0 && std::isfinite(eps_high))) return Status::Error("eps_high: must be >= 0");
  if (!(dual_clip_c == 0 || (dual_clip_c > 1 && std::isfinite(dual_clip_c)))) {
    return Status::Error("dual_clip_c: must be 0 (off) or > 1");
  }
  if (!(kl_coef >= 0 && std::isfinite(kl_coef))) return Status::Error("kl_coef: must be >= 0");
  if (!std::isfinite(entropy_coef)) return Status::Error("entropy_coef: must be finite");
  if (!(token_normaliser >= 0 && std::isfinite(token_normaliser))) {
    return Status::Error("token_normaliser: must be >= 0 (0 = local masked token count)");
  }
  if (!(sample_normaliser >= 0 && std::isfinite(sample_normaliser))) {
    return Status::Error("sample_normaliser: must be >= 0 (0 = local sample count)");
  }
  if (reduction == LossReduction::kConstant &&
      !(constant_normaliser > 0 && std::isfinite(constant_normaliser))) {
    return Status::Error("constant_normaliser: must be > 0 for reduction kConstant");
  }
  if (correction == IsCorrection::kTis && !(tis_c > 0 && std::isfinite(tis_c))) {
    return Status::Error("tis_c: must be > 0");
  }
  if (correction == IsCorrection::kMisToken || correction == IsCorrection::kMisSequence) {
    if (!(mis_low >= 0)) return Status::Error("mis_low: must be >= 0");
    if (!(mis_high >= mis_low)) return Status::Error("mis_high: must be >= mis_low");
  }
  return Status::Ok();
}

namespace {

struct Surrogate {
  double loss;      // l
  double dloss_dr;  // d l / d r
  bool clipped;     // ratio clip taken
  bool dual;        // dual-clip bound taken
};

Surrogate surrogate(const LossConfig& c, double r, double a) {
  const double pg1 = -r * a;
  const double pg2 = -std::clamp(r, 1.0 - c.eps_low, 1.0 + c.eps_high) * a;
  Surrogate out{pg1 >= pg2 ? pg1 : pg2, pg1 >= pg2 ? -a : 0.0, pg2 > pg1, false};
  if (c.dual_clip_c > 0 && a < 0) {
    const double pg3 = -c.dual_clip_c * a;
    if (pg3 < out.loss) out = {pg3, 0.0, out.clipped, true};
  }
  return out;
}

// KL estimator value and its derivative with respect to logp.
std::pair<double, double> kl_term(KlEstimator k, double logp, double ref) {
  const double x = logp - ref;
  switch (k) {
    case KlEstimator::kNone:
      return {0.0, 0.0};
    case KlEstimator::kK1:
      return {x, 1.0};
    case KlEstimator::kK2:
      return {0.5 * x * x, x};
    case KlEstimator::kK3:
      return {std::exp(-x) + x - 1.0, 1.0 - std::exp(-x)};
  }
  return {0.0, 0.0};
}

Status check_batch(const LossConfig& config, const TokenBatch& b, bool sft) {
  MILES_RETURN_IF_ERROR(detail::check_layout(b.offsets, b.loss_mask));
  const auto n = static_cast<size_t>(b.offsets.back());
  MILES_RETURN_IF_ERROR(detail::check_array("logp", b.logp, n, true));
  if (sft) return Status::Ok();
  MILES_RETURN_IF_ERROR(detail::check_array("old_logp", b.old_logp, n, true));
  MILES_RETURN_IF_ERROR(detail::check_array("advantages", b.advantages, n, true));
  MILES_RETURN_IF_ERROR(
      detail::check_array("ref_logp", b.ref_logp, n, config.kl != KlEstimator::kNone));
  MILES_RETURN_IF_ERROR(detail::check_array("entropy", b.entropy, n, config.entropy_coef != 0));
  MILES_RETURN_IF_ERROR(detail::check_array("rollout_logp", b.rollout_logp, n,
                                            config.correction != IsCorrection::kNone));
  return Status::Ok();
}

}  // namespace

Result<LossResult> policy_loss(const LossConfig& config, const TokenBatch& b) {
  MILES_RETURN_IF_ERROR(config.validate());
  MILES_RETURN_IF_ERROR(check_batch(config, b, false));
  MILES_ASSIGN_OR_RETURN(std::vector<double> rho,
                         detail::reduction_weights(config, b.offsets, b.loss_mask));
  const detail::IsCorrectionTerms corr = detail::is_correction(config, b);
  const size_t num_tokens = b.loss_mask.size();
  const size_t num_samples = b.offsets.size() - 1;

  LossResult res;
  std::vector<double> dlogp(num_tokens, 0.0);
  res.dentropy.assign(num_tokens, 0.0f);
  int64_t masked = 0, clipped = 0, dual = 0;
  double ppo_kl = 0;

  for (size_t s = 0; s < num_samples; ++s) {
    const int64_t begin = b.offsets[s], end = b.offsets[s + 1];
    const int64_t n_s = detail::masked_count(b.offsets, b.loss_mask, s);
    double seq_ratio = 1.0;
    if (config.policy == PolicyLossKind::kGspo) {
      double sum = 0;
      for (int64_t t = begin; t < end; ++t) {
        if (b.loss_mask[t] == 1.0f) sum += double(b.logp[t]) - double(b.old_logp[t]);
      }
      seq_ratio = std::exp(sum / static_cast<double>(n_s > 0 ? n_s : 1));
    }
    double seq_grad = 0;  // GSPO: d loss / d r_s
    for (int64_t t = begin; t < end; ++t) {
      if (b.loss_mask[t] != 1.0f) continue;
      const double logp = b.logp[t], old = b.old_logp[t];
      const double r = config.policy == PolicyLossKind::kGspo ? seq_ratio : std::exp(logp - old);
      const Surrogate sur = surrogate(config, r, b.advantages[t]);
      const double w = rho[t] * corr.keep[t];
      res.pg_loss += w * corr.pg_weight[t] * sur.loss;
      const double dr = w * corr.pg_weight[t] * sur.dloss_dr;
      if (config.policy == PolicyLossKind::kGspo) {
        seq_grad += dr;
      } else {
        dlogp[t] += dr * r;
      }
      if (config.kl != KlEstimator::kNone) {
        const auto [kl, dkl] = kl_term(config.kl, logp, b.ref_logp[t]);
        res.kl_loss += w * kl;
        dlogp[t] += config.kl_coef * w * dkl;
      }
      if (!b.entropy.empty()) res.entropy_loss += w * b.entropy[t];
      if (config.entropy_coef != 0) res.dentropy[t] = static_cast<float>(-config.entropy_coef * w);
      ++masked;
      clipped += sur.clipped ? 1 : 0;
      dual += sur.dual ? 1 : 0;
      ppo_kl += old - logp;
    }
    if (config.policy == PolicyLossKind::kGspo) {
      const double g = seq_grad * seq_ratio / static_cast<double>(n_s > 0 ? n_s : 1);
      for (int64_t t = begin; t < end; ++t) dlogp[t] += b.loss_mask[t] * g;
    }
  }
  res.loss = res.pg_loss + config.kl_coef * res.kl_loss - config.entropy_coef * res.entropy_loss;
  res.dlogp.assign(dlogp.begin(), dlogp.end());

  LossMetrics& m = res.metrics;
  m.num_tokens = masked;
  m.ppo_kl = ppo_kl / static_cast<double>(masked);
  m.clipfrac = static_cast<double>(clipped) / static_cast<double>(masked);
  m.dual_clipfrac = static_cast<double>(dual) / static_cast<double>(masked);
  m.correction_frac = static_cast<double>(corr.corrected) / static_cast<double>(masked);
  if (!b.rollout_logp.empty()) detail::mismatch_metrics(b, m);
  return res;
}

Result<LossResult> sft_loss(const LossConfig& config, const TokenBatch& b) {
  LossConfig reduce_only;  // only the reduction and its normalisers matter here
  reduce_only.reduction = config.reduction;
  reduce_only.token_normaliser = config.token_normaliser;
  reduce_only.sample_normaliser = config.sample_normaliser;
  reduce_only.constant_normaliser = config.constant_normaliser;
  MILES_RETURN_IF_ERROR(reduce_only.validate());
  MILES_RETURN_IF_ERROR(check_batch(reduce_only, b, true));
  MILES_ASSIGN_OR_RETURN(std::vector<double> rho,
                         detail::reduction_weights(reduce_only, b.offsets, b.loss_mask));
  LossResult res;
  res.dlogp.assign(rho.size(), 0.0f);
  res.dentropy.assign(rho.size(), 0.0f);
  for (size_t t = 0; t < rho.size(); ++t) {
    res.pg_loss += rho[t] * -static_cast<double>(b.logp[t]);
    res.dlogp[t] = static_cast<float>(-rho[t]);
    res.metrics.num_tokens += b.loss_mask[t] == 1.0f ? 1 : 0;
  }
  res.loss = res.pg_loss;
  return res;
}

}  // namespace miles::rl
