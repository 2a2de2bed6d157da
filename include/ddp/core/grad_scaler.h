#pragma once
// Loss scaling for mixed precision, as PyTorch's torch.cuda.amp.GradScaler (same defaults, same
// update rule, same state_dict keys), with the inf/NaN check agreed across ranks:
//
//   ddp::amp::GradScaler scaler(group);
//   scaler.scale(loss).backward();   // gradients of loss x scale, reduced by DDP
//   scaler.unscale_(optimizer);      // optional: to clip the true gradients first
//   scaler.step(optimizer);          // skipped on every rank when any rank saw an inf or NaN
//   scaler.update();                 // halve the scale after a skip; double it after
//                                    // growth_interval steps in a row without one
//
// DDP's all-reduce already spreads an inf to every rank; the agreement matters where gradients
// are not all-reduced before the step (no_sync, sharded optimizers, a hook that drops values):
// one rank must never step while another skips, or the replicas diverge.

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "ddp/comm/process_group.h"

namespace ddp::amp {

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;  // 2^16
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

// PyTorch's GradScaler.state_dict(): {"scale", "growth_factor", "backoff_factor",
// "growth_interval", "_growth_tracker"}.
struct GradScalerState {
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;  // successful steps since the last growth or skip
};

class GradScaler {
 public:
  // `group` may be null (one process): then the inf check is local.
  explicit GradScaler(std::shared_ptr<comm::ProcessGroup> group = nullptr,
                      GradScalerOptions options = {});

  // `loss` times the current scale (float32 scale, as PyTorch).
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides the optimizer's gradients by the scale and records whether any rank has an inf or
  // NaN among them (a collective when there is a group). Once per step; throws Error if called
  // again before update().
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_ unless done, then optimizer.step() unless an inf or NaN was found. Returns whether
  // it stepped (the same on every rank).
  bool step(torch::optim::Optimizer& optimizer);
  // After step(): backs the scale off after a skip, grows it after growth_interval clean steps.
  void update();

  double get_scale() const { return state_.scale; }
  const GradScalerState& state() const { return state_; }
  void load_state(const GradScalerState& state) { state_ = state; }
  // The group of the inf check from now on (--elastic: each generation's; null: none yet).
  void set_group(std::shared_ptr<comm::ProcessGroup> group) { group_ = std::move(group); }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  GradScalerState state_;
  bool unscaled_ = false;   // unscale_ ran since the last update()
  bool found_inf_ = false;  // what it found, agreed across ranks
  bool stepped_ = false;    // step() ran since the last update()
};

// The state as PyTorch's state_dict() (a dict of str to float or int), and back; `origin` names
// the source in errors.
c10::IValue to_ivalue(const GradScalerState& state);
GradScalerState grad_scaler_state_from(const c10::IValue& value, const std::string& origin);

}  // namespace ddp::amp
