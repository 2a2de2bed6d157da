#include "ddp/nn/forward_hooks.h"

namespace ddp::nn {
namespace {

thread_local ForwardHooks* t_hooks = nullptr;

bool holds_wanted(ForwardHooks& hooks, const torch::nn::Module& module) {
  for (const auto& inner : module.modules(/*include_self=*/false)) {
    if (hooks.wants(*inner)) return true;
  }
  return false;
}

}  // namespace

ForwardHooks* ForwardHooks::current() {
  return t_hooks;
}

ForwardHooks* ForwardHooks::install(ForwardHooks* hooks) {
  ForwardHooks* previous = t_hooks;
  t_hooks = hooks;
  return previous;
}

torch::Tensor forward_sequential(torch::nn::SequentialImpl& sequential, torch::Tensor x) {
  ForwardHooks* hooks = ForwardHooks::current();
  if (hooks == nullptr) return sequential.forward(std::move(x));
  for (auto& child : sequential) {
    const auto& module = *child.ptr();
    if (hooks->wants(module)) {
      hooks->before(module);
      x = child.forward(hooks->input(module, std::move(x)));
      hooks->after(module, {&x});
    } else if (auto* inner = child.ptr()->as<torch::nn::SequentialImpl>();
               inner != nullptr && holds_wanted(*hooks, *inner)) {
      x = forward_sequential(*inner, std::move(x));
    } else {
      x = child.forward(x);
    }
  }
  return x;
}

}  // namespace ddp::nn
