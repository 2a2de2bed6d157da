#pragma once
// DiLoCo and local SGD (Douillard et al., "DiLoCo: Distributed Low-Communication Training of
// Language Models", 2023, Algorithm 1): each rank trains its own copy of the model with its inner
// optimizer for `sync_every` (H) steps, without communicating; then the ranks average how far
// their copies moved from the last global parameters (the outer gradient, one all-reduce of all
// parameters) and an outer optimizer, SGD with Nesterov momentum, steps the global parameters
// with it, which every rank then takes as its copy. Local SGD is the special case outer_lr 1,
// momentum 0: the copies are averaged.
//
// With a delay of tau steps (Douillard et al., "Streaming DiLoCo with overlapping communication",
// 2025; torchft's fragment_sync_delay) the outer gradient of each round is taken at its step
// H - tau and all-reduced while the last tau inner steps run; at step H the outer step lands and
// each copy becomes the new global parameters plus its own progress of those tau steps (which
// the next round's outer gradient then carries), so no step's work is discarded. Where the
// all-reduce completes does not matter: the outer step lands at step H on every rank, so the
// results are those of the schedule alone. tau = 0 is Algorithm 1.

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
  int64_t delay = 0;  // tau: inner steps the outer all-reduce overlaps (below sync_every)
  // Local SGD: the copies are averaged every `sync_every` steps.
  static DiLoCoOptions local_sgd(int64_t sync_every, int64_t delay = 0) {
    return {sync_every, 1.0, 0.0, false, delay};
  }
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
  // of the group: every rank calls it as often; with a delay, the all-reduce starts `delay`
  // calls earlier). Returns whether the global parameters changed.
  bool after_inner_step();

  // Synchronizes now if an inner step was taken since the last synchronization (the trainer's
  // epoch end: evaluation, checkpoints and model.pt then see the global parameters, the same on
  // every rank): an outer step in flight lands first, then the steps it did not carry are
  // synchronized at once; H counts again from here. A collective, as after_inner_step.
  void synchronize_if_pending();

  int64_t inner_steps() const { return steps_; }
  const DiLoCoOptions& options() const { return options_; }

  // The outer optimizer's momentum buffers (empty before the first synchronization, or without
  // momentum): the same on every rank, for checkpoints.
  const std::vector<at::Tensor>& momentum() const { return momentum_; }
  // The global parameters of the last synchronization (the model's own between them).
  const std::vector<at::Tensor>& global_parameters() const { return global_; }
  // Resuming: the global parameters become the model's current ones (just loaded, the same on
  // every rank), the momentum `momentum` (momentum()'s, or empty). Not while an all-reduce is
  // in flight (after synchronize_if_pending, none is).
  void restart(std::vector<at::Tensor> momentum);

 private:
  void launch();  // the outer gradient of the steps so far, all-reduced in the background
  void land();    // waits for it, steps the global parameters, and the model's follow

  std::vector<at::Tensor> params_;  // the model's, trained by the inner optimizer
  std::vector<at::Tensor> global_;  // the global parameters of the last synchronization
  std::vector<at::Tensor> momentum_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DiLoCoOptions options_;
  int64_t steps_ = 0;
  int64_t last_sync_ = 0;    // steps_ at the last synchronization: H counts from here
  int64_t launched_at_ = 0;  // steps_ at the last launch: later steps are in no outer gradient
  // In flight between launch() and land(): the averaged outer gradient, its all-reduce, and the
  // model's parameters it was taken from (with a delay: their progress since is kept).
  at::Tensor outer_grad_;
  comm::WorkPtr work_;
  std::vector<at::Tensor> launched_;
};

}  // namespace ddp
