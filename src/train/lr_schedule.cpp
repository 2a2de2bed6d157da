#include "ddp/train/lr_schedule.h"

#include <cmath>

namespace ddp::train {

double lr_at(const LrSchedule& s, int64_t step, int64_t steps_per_epoch) {
  const double per_epoch = static_cast<double>(steps_per_epoch > 0 ? steps_per_epoch : 1);
  const double warmup_steps = s.warmup_epochs * per_epoch;
  if (static_cast<double>(step) < warmup_steps) {
    return s.base_lr * static_cast<double>(step + 1) / warmup_steps;
  }
  const double epoch = static_cast<double>(step) / per_epoch;  // fractional epochs done
  if (s.kind == "step") {
    const auto decays = static_cast<int64_t>(std::floor(epoch)) / s.step_size;
    return s.base_lr * std::pow(s.gamma, static_cast<double>(decays));
  }
  if (s.kind == "cosine") {
    const double span = static_cast<double>(s.total_epochs) - s.warmup_epochs;
    if (span <= 0.0) return s.base_lr;
    const double progress = std::min(1.0, (epoch - s.warmup_epochs) / span);
    return s.base_lr * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return s.base_lr;
}

double scaled_lr(double lr, LrScaling scaling, int64_t global_batch, int64_t reference_batch) {
  if (scaling != LrScaling::kLinear) return lr;
  return lr * static_cast<double>(global_batch) / static_cast<double>(reference_batch);
}

}  // namespace ddp::train
