#pragma once
// A model with frozen parameters, as fine-tuning with LoRA makes them: frozen Linear bases under
// trainable low-rank adapters, for the sharded model's tests (a unit's frozen and trainable
// parameters, a unit with nothing trainable, the root unit with both).
#include <torch/torch.h>

#include "ddp/nn/forward_hooks.h"

namespace ddp::testing {

// A frozen Linear base plus a trainable adapter of rank `rank`: tanh(base(x) + x down^T up^T).
struct AdaptedImpl : torch::nn::Module {
  AdaptedImpl(int64_t width, int64_t rank)
      : base(register_module("base", torch::nn::Linear(width, width))),
        down(register_parameter("down", torch::randn({rank, width}) * 0.1)),
        up(register_parameter("up", torch::randn({width, rank}) * 0.1)) {
    for (auto& p : base->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // The base first: its node then runs last in the backward, after the adapter's gradients
    // are complete, and the frozen weight must still be there for it.
    auto frozen = base(x);
    return torch::tanh(frozen + x.matmul(down.t()).matmul(up.t()));
  }
  torch::nn::Linear base;
  torch::Tensor down, up;
};
TORCH_MODULE(Adapted);

// A frozen Linear stem, two adapted blocks `a` and `b` (each called through ddp::nn::call, so
// that they may be units), and a trainable head to `classes` outputs.
struct AdaptedNetImpl : torch::nn::Module {
  AdaptedNetImpl(int64_t width, int64_t rank, int64_t classes)
      : stem(register_module("stem", torch::nn::Linear(width, width))),
        a(register_module("a", Adapted(width, rank))),
        b(register_module("b", Adapted(width, rank))),
        head(register_module("head", torch::nn::Linear(width, classes))) {
    for (auto& p : stem->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head(ddp::nn::call(b, ddp::nn::call(a, ddp::nn::call(stem, x))));
  }
  torch::nn::Linear stem;
  Adapted a, b;
  torch::nn::Linear head;
};
TORCH_MODULE(AdaptedNet);

// `module`'s parameters that require grad: what an optimizer over the unwrapped model steps.
inline std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> trainable;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  return trainable;
}

// The gradients of `module`'s parameters that require grad, flattened end to end in their
// order: what a unit's shard gradient is at world size 1.
inline torch::Tensor trainable_gradients(torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) grads.push_back(p.grad().reshape(-1));
  }
  return torch::cat(grads);
}

// `to`'s parameters set to `from`'s (the same architecture).
inline void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.parameters();
  const auto target = to.parameters();
  for (size_t i = 0; i < target.size(); ++i) target[i].copy_(source[i]);
}

}  // namespace ddp::testing
