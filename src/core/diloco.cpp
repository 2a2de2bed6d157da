#include "ddp/core/diloco.h"

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
  for (const auto& p : params_) global_.push_back(p.detach().clone());
}

bool DiLoCo::after_inner_step() {
  ++steps_;
  if (steps_ - last_sync_ < options_.sync_every) return false;
  synchronize();
  return true;
}

void DiLoCo::synchronize_if_pending() {
  if (steps_ > last_sync_) synchronize();
}

void DiLoCo::restart(std::vector<at::Tensor> momentum) {
  for (size_t i = 0; i < params_.size(); ++i) global_[i] = params_[i].detach().clone();
  momentum_ = std::move(momentum);
  last_sync_ = steps_;
}

// Algorithm 1's outer step: the outer gradient is the average over ranks of (global - local),
// all-reduced as one flat tensor per dtype and device would be; here, one all-reduce of all
// parameters concatenated (they share the model's dtype and device).
void DiLoCo::synchronize() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> deltas;
  for (size_t i = 0; i < params_.size(); ++i) {
    deltas.push_back((global_[i] - params_[i].detach()).reshape({-1}));
  }
  at::Tensor flat = at::cat(deltas);
  group_->all_reduce(flat, comm::ReduceOp::kAvg)->wait();
  std::vector<at::Tensor> grads;
  int64_t offset = 0;
  for (const auto& g : global_) {
    grads.push_back(flat.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
  outer_sgd_step(global_, momentum_, grads, options_.outer_lr, options_.outer_momentum,
                 options_.nesterov);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].detach().copy_(global_[i]);
  last_sync_ = steps_;
}

}  // namespace ddp
