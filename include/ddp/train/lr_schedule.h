#pragma once
// The learning rate as a pure function of the step: linear warm-up (Goyal et al.), then a
// constant, step or cosine schedule over the remaining epochs.

#include <cstdint>
#include <string>

namespace ddp::train {

struct LrSchedule {
  std::string kind = "constant";  // constant | step | cosine
  double base_lr = 0.1;
  double warmup_epochs = 0.0;
  int64_t step_size = 30;  // step: epochs between decays
  double gamma = 0.1;      // step: decay factor
  int64_t total_epochs = 1;
};

// The lr for optimizer step `step` (0-based) of a run with `steps_per_epoch` steps per epoch.
// Warm-up rises linearly to base_lr and reaches it at the last warm-up step; the step schedule
// decays by gamma every step_size whole epochs; cosine falls from base_lr to 0 at the run's end.
double lr_at(const LrSchedule& schedule, int64_t step, int64_t steps_per_epoch);

enum class LrScaling {
  kNone,    // the lr as given
  kLinear,  // lr x global batch / reference batch (Goyal et al., "Accurate, Large Minibatch SGD")
};

// The base lr for a global batch: `lr` itself, or scaled as `scaling` says.
double scaled_lr(double lr, LrScaling scaling, int64_t global_batch, int64_t reference_batch);

}  // namespace ddp::train
