#pragma once
// DiLoCo and local SGD (Douillard et al., "DiLoCo: Distributed Low-Communication Training of
// Language Models", 2023, Algorithm 1): each rank trains its own copy of the model with its inner
// optimizer for `sync_every` (H) steps, without communicating; then the ranks average how far
// their copies moved from the last global parameters (the outer gradient, one all-reduce of all
// parameters) and an outer optimizer, SGD with Nesterov momentum, steps the global parameters
// with it, which every rank then takes as its copy. Local SGD is the special case outer_lr 1,
// momentum 0: the copies are averaged.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

struct DiLoCoOptions {
  int64_t sync_every = 500;     // H: inner steps between synchronizations (the paper's 500)
  double outer_lr = 0.7;        // the paper's
  double outer_momentum = 0.9;  // the paper's
  bool nesterov = true;
  // Local SGD: the copies are averaged every `sync_every` steps.
  static DiLoCoOptions local_sgd(int64_t sync_every) { return {sync_every, 1.0, 0.0, false}; }
};

// One step of torch.optim.SGD(lr, momentum, nesterov, dampening 0, weight decay 0) on `params`
// with gradients `grads`; `momentum` holds the buffers, empty before the first step (which sets
// them to the gradients, as PyTorch does). In place; a pure function of its arguments otherwise.
void outer_sgd_step(std::vector<at::Tensor>& params, std::vector<at::Tensor>& momentum,
                    const std::vector<at::Tensor>& grads, double lr, double mu, bool nesterov);

class DiLoCo {
 public:
  // `params`: the model's parameters on this rank (the same values on every rank: after DDP's
  // broadcast, or a checkpoint). They are the first global parameters.
  DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<comm::ProcessGroup> group,
         DiLoCoOptions options);

  // Call after each inner optimizer step; every `sync_every`-th call synchronizes (a collective
  // of the group: every rank calls it as often). Returns whether it did.
  bool after_inner_step();

  // Synchronizes now if an inner step was taken since the last synchronization (the trainer's
  // epoch end: evaluation, checkpoints and model.pt then see the global parameters, the same on
  // every rank); H counts again from here. A collective, as after_inner_step.
  void synchronize_if_pending();

  int64_t inner_steps() const { return steps_; }
  const DiLoCoOptions& options() const { return options_; }

  // The outer optimizer's momentum buffers (empty before the first synchronization, or without
  // momentum): the same on every rank, for checkpoints.
  const std::vector<at::Tensor>& momentum() const { return momentum_; }
  // Resuming: the global parameters become the model's current ones (just loaded, the same on
  // every rank), the momentum `momentum` (momentum()'s, or empty).
  void restart(std::vector<at::Tensor> momentum);

 private:
  void synchronize();

  std::vector<at::Tensor> params_;  // the model's, trained by the inner optimizer
  std::vector<at::Tensor> global_;  // the global parameters of the last synchronization
  std::vector<at::Tensor> momentum_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DiLoCoOptions options_;
  int64_t steps_ = 0;
  int64_t last_sync_ = 0;  // steps_ at the last synchronization
};

}  // namespace ddp
