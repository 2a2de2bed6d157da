#pragma once
// The forward hooks LibTorch's C++ modules lack (pytorch#25888: a C++ module's forward is an
// ordinary method, which nothing can intercept), as one call: a model whose forward calls a
// submodule through ddp::nn::call gives whatever hooks are installed on this thread (a sharded
// model's forward installs its own: ddp/core/fully_shard.h) the moment before that submodule's
// forward and its output after. With no hooks installed, or a module the hooks do not want, it is
// the plain call, so a model written this way runs the same unwrapped:
//
//   x = ddp::nn::call(block, x);   // instead of x = block(x), or block->forward(x)
//   auto [out, state] = ddp::nn::call(lstm, x);   // a forward returning several tensors
//   x = ddp::nn::forward_sequential(*net, x);   // instead of net->forward(x), for a Sequential
//
// A forward may return a tensor, or std::tuple, std::pair, std::vector or std::optional of what a
// forward may return (LSTM's tuple of a tensor and a tuple, attention's output and weights); any
// other type (a struct of the user's) names its tensors by a function found next to it:
//
//   std::vector<torch::Tensor*> ddp_output_tensors(MyOutput& out) { return {&out.y, &out.aux}; }
//
// Free of everything but torch::nn, so that the models' layer may use it.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp::nn {

class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Whether the hooks act around `module`'s forward.
  virtual bool wants(const torch::nn::Module& module) = 0;
  // Right before `module`'s forward.
  virtual void before(const torch::nn::Module& module) = 0;
  // Right after it, with the tensors of its output (each may be replaced: the caller gets them).
  virtual void after(const torch::nn::Module& module,
                     const std::vector<torch::Tensor*>& outputs) = 0;
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
template <class T>
struct IsTuple : std::false_type {};
template <class... Ts>
struct IsTuple<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct IsTuple<std::pair<A, B>> : std::true_type {};
template <class T>
struct IsVector : std::false_type {};
template <class T, class A>
struct IsVector<std::vector<T, A>> : std::true_type {};
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T, class = void>
struct HasOutputTensors : std::false_type {};
template <class T>
struct HasOutputTensors<T, std::void_t<decltype(ddp_output_tensors(std::declval<T&>()))>>
    : std::true_type {};

// Adds the tensors in `output` to `tensors`.
template <class T>
void collect_tensors(T& output, std::vector<torch::Tensor*>& tensors) {
  if constexpr (std::is_same_v<T, torch::Tensor>) {
    tensors.push_back(&output);
  } else if constexpr (IsTuple<T>::value) {
    std::apply([&](auto&... items) { (collect_tensors(items, tensors), ...); }, output);
  } else if constexpr (IsVector<T>::value) {
    for (auto& item : output) collect_tensors(item, tensors);
  } else if constexpr (IsOptional<T>::value) {
    if (output) collect_tensors(*output, tensors);
  } else {
    static_assert(HasOutputTensors<T>::value,
                  "ddp::nn::call: the unit's forward returns a type whose tensors it cannot find: "
                  "define std::vector<torch::Tensor*> ddp_output_tensors(YourType&) beside it");
    for (torch::Tensor* tensor : ddp_output_tensors(output)) tensors.push_back(tensor);
  }
}
}  // namespace detail

// `module`'s forward with `args` (the tensors among them through the hooks' input()), between the
// installed hooks' before() and after() (given the output's tensors) when they want `module`.
// `module`: a module holder (torch::nn::Linear, a TORCH_MODULE), a shared_ptr or a pointer to a
// module; its forward returns what the header's comment says.
template <class M, class... Args>
auto call(M&& module, Args&&... args) {
  ForwardHooks* hooks = ForwardHooks::current();
  if (hooks == nullptr || !hooks->wants(*module)) {
    return module->forward(std::forward<Args>(args)...);
  }
  hooks->before(*module);
  auto output = module->forward(detail::hooked_input(*hooks, *module, std::forward<Args>(args))...);
  std::vector<torch::Tensor*> tensors;
  detail::collect_tensors(output, tensors);
  hooks->after(*module, tensors);
  return output;
}

// A Sequential's forward (each child's output the next one's input), each child through call():
// the same result as sequential->forward(x), with the installed hooks around the children they
// want, and around those inside the Sequentials it holds (a child Sequential holding one they want
// runs child by child too).
torch::Tensor forward_sequential(torch::nn::SequentialImpl& sequential, torch::Tensor x);

}  // namespace ddp::nn
