#include "ddp/core/diloco.h"

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp {

void outer_sgd_step(std::vector<at::Tensor>& params, std::vector<at::Tensor>& momentum,
                    const std::vector<at::Tensor>& grads, double lr, double mu, bool nesterov) {
  DDP_CHECK(params.size() == grads.size(), "outer_sgd_step: one gradient per parameter");
  const bool first = momentum.empty();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor d = grads[i];
    if (mu != 0) {
      // torch.optim.SGD: buf = g on the first step, then buf = mu * buf + g (dampening 0).
      if (first) {
        momentum.push_back(grads[i].clone());
      } else {
        momentum[i].mul_(mu).add_(grads[i]);
      }
      d = nesterov ? grads[i].add(momentum[i], mu) : momentum[i];
    }
    params[i].add_(d, -lr);
  }
}

DiLoCo::DiLoCo(std::vector<at::Tensor> params, std::shared_ptr<comm::ProcessGroup> group,
               DiLoCoOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  if (options_.sync_every < 1) {
    throw InputError("DiLoCo: sync_every must be at least 1, got " +
                     std::to_string(options_.sync_every));
  }
  if (options_.delay < 0 || options_.delay >= options_.sync_every) {
    throw InputError(
        fmt::format("DiLoCo: the delay must be at least 0 and below sync_every ({}), "
                    "got {}",
                    options_.sync_every, options_.delay));
  }
  for (const auto& p : params_) global_.push_back(p.detach().clone());
}

bool DiLoCo::after_inner_step() {
  ++steps_;
  const int64_t since = steps_ - last_sync_;
  if (since == options_.sync_every - options_.delay) launch();
  if (since < options_.sync_every) return false;
  land();
  return true;
}

void DiLoCo::synchronize_if_pending() {
  if (work_) land();
  if (steps_ > launched_at_) {  // steps no outer gradient carried (with a delay: its last ones)
    launch();
    land();
  }
}

void DiLoCo::restart(std::vector<at::Tensor> momentum) {
  DDP_CHECK(!work_, "DiLoCo::restart while an outer gradient is in flight");
  for (size_t i = 0; i < params_.size(); ++i) global_[i] = params_[i].detach().clone();
  momentum_ = std::move(momentum);
  last_sync_ = launched_at_ = steps_;
}

// Algorithm 1's outer gradient, the average over ranks of (global - local): one all-reduce of
// all parameters concatenated (they share the model's dtype and device), not waited for here.
void DiLoCo::launch() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> deltas;
  for (size_t i = 0; i < params_.size(); ++i) {
    deltas.push_back((global_[i] - params_[i].detach()).reshape({-1}));
  }
  outer_grad_ = at::cat(deltas);
  work_ = group_->all_reduce(outer_grad_, comm::ReduceOp::kAvg);
  if (options_.delay > 0) {  // land() clears them
    for (const auto& p : params_) launched_.push_back(p.detach().clone());
  }
  launched_at_ = steps_;
}

// Algorithm 1's outer step; each copy becomes the new global parameters, plus what it learnt
// since launch() (with a delay; none without).
void DiLoCo::land() {
  at::NoGradGuard no_grad;
  work_->wait();
  work_.reset();
  std::vector<at::Tensor> grads;
  int64_t offset = 0;
  for (const auto& g : global_) {
    grads.push_back(outer_grad_.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
  outer_sgd_step(global_, momentum_, grads, options_.outer_lr, options_.outer_momentum,
                 options_.nesterov);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].detach();
    if (launched_.empty()) {
      p.copy_(global_[i]);
    } else {
      p.sub_(launched_[i]).add_(global_[i]);
    }
  }
  outer_grad_ = at::Tensor();
  launched_.clear();
  last_sync_ = steps_;
}

}  // namespace ddp
