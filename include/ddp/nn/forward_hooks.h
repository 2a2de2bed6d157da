#pragma once
// The forward hooks LibTorch's C++ modules lack (pytorch#25888: a C++ module's forward is an
// ordinary method, which nothing can intercept), as one call: a model whose forward calls a
// submodule through ddp::nn::call gives whatever hooks are installed on this thread (a sharded
// model's forward installs its own: ddp/core/fully_shard.h) the moment before that submodule's
// forward and its output after. With no hooks installed, or a module the hooks do not want, it is
// the plain call, so a model written this way runs the same unwrapped:
//
//   x = ddp::nn::call(block, x);   // instead of x = block(x), or block->forward(x)
//   x = ddp::nn::forward_sequential(*net, x);   // instead of net->forward(x), for a Sequential
//
// Free of everything but torch::nn, so that the models' layer may use it.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <type_traits>
#include <utility>

namespace ddp::nn {

class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Whether the hooks act around `module`'s forward.
  virtual bool wants(const torch::nn::Module& module) = 0;
  // Right before `module`'s forward.
  virtual void before(const torch::nn::Module& module) = 0;
  // Right after it, with its output; returns what the caller gets.
  virtual torch::Tensor after(const torch::nn::Module& module, torch::Tensor output) = 0;
  // Each tensor argument of `module`'s forward, as the forward gets it (after before()).
  virtual torch::Tensor input(const torch::nn::Module& /*module*/, torch::Tensor x) { return x; }

  // This thread's hooks (nullptr: none).
  static ForwardHooks* current();
  // Installs `hooks` (nullptr: none) on this thread; returns the ones it replaces.
  static ForwardHooks* install(ForwardHooks* hooks);
};

namespace detail {
// A tensor argument as the hooks give it to the forward; any other as it is.
template <class A>
decltype(auto) hooked_input(ForwardHooks& hooks, const torch::nn::Module& module, A&& arg) {
  if constexpr (std::is_same_v<std::decay_t<A>, torch::Tensor>) {
    return hooks.input(module, arg);
  } else {
    return std::forward<A>(arg);
  }
}
}  // namespace detail

// `module`'s forward with `args` (the tensors among them through the hooks' input()), between the
// installed hooks' before() and after() when they want `module`. `module`: a module holder
// (torch::nn::Linear, a TORCH_MODULE), a shared_ptr or a pointer to a module; its forward returns a
// Tensor.
template <class M, class... Args>
torch::Tensor call(M&& module, Args&&... args) {
  ForwardHooks* hooks = ForwardHooks::current();
  if (hooks == nullptr || !hooks->wants(*module)) {
    return module->forward(std::forward<Args>(args)...);
  }
  hooks->before(*module);
  return hooks->after(
      *module, module->forward(detail::hooked_input(*hooks, *module, std::forward<Args>(args))...));
}

// A Sequential's forward (each child's output the next one's input), each child through call():
// the same result as sequential->forward(x), with the installed hooks around the children they
// want, and around those inside the Sequentials it holds (a child Sequential holding one they want
// runs child by child too).
torch::Tensor forward_sequential(torch::nn::SequentialImpl& sequential, torch::Tensor x);

}  // namespace ddp::nn
