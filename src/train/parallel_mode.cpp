#include "parallel_mode.h"

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/train/run_options.h"

namespace ddp::train {

void ParallelMode::optimizer_step(amp::GradScaler* scaler) {
  // --amp fp16: the true gradients first, and whether any rank has an inf or NaN in them.
  if (scaler != nullptr) scaler->unscale_(optimizer());
  if (run_.config.clip_grad_norm > 0) clip_gradients(run_.config.clip_grad_norm);
  if (scaler == nullptr) return step_optimizer();
  // Skipped on every rank after an inf or NaN, with the scale halved (PyTorch's rule).
  if (!scaler->step(optimizer())) log::debug("the optimizer step skipped (inf or NaN)");
  scaler->update();
}

OptimizerFactory ParallelMode::optimizer_factory() const {
  return [this](const std::vector<torch::Tensor>& params) {
    return make_optimizer(run_.config, params);
  };
}

namespace {

// What the option rules of the modes without it refuse at start (uneven, elastic).
[[noreturn]] void not_in_mode(const Config& config, const char* what) {
  throw Error(fmt::format("parallel {} has no {}: its option rules refuse it",
                          to_string(config.parallel), what));
}

}  // namespace

void ParallelMode::begin_join() {
  not_in_mode(run_.config, "Join (uneven)");
}

void ParallelMode::finish_join() {
  not_in_mode(run_.config, "Join (uneven)");
}

void ParallelMode::fill_heal(Checkpoint&) {
  not_in_mode(run_.config, "elastic heal");
}

void ParallelMode::add_to_digest(Digest&) {
  not_in_mode(run_.config, "elastic heal");
}

}  // namespace ddp::train
