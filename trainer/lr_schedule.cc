// Learning-rate schedule: linear warm-up, then constant or cosine decay (optimizer.h).
#include <cmath>
#include <numbers>

#include "miles/trainer/optimizer.h"

namespace miles {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == Decay::kConstant) return lr;
  const int64_t span = total_steps - warmup_steps;
  if (span <= 0 || step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

Status LrSchedule::validate() const {
  if (!(lr > 0) || !std::isfinite(lr))
    return Status::Error("optimizer.lr must be a positive number");
  if (!(min_lr >= 0) || min_lr > lr) return Status::Error("optimizer.min_lr must be in [0, lr]");
  if (warmup_steps < 0) return Status::Error("optimizer.warmup_steps must be >= 0");
  if (decay == Decay::kCosine && total_steps <= warmup_steps)
    return Status::Error(
        "optimizer.total_steps must be greater than warmup_steps for cosine decay");
  return Status::Ok();
}

}  // namespace miles
