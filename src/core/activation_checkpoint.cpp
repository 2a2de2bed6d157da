#include "ddp/core/activation_checkpoint.h"

#include <torch/torch.h>

namespace ddp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `fn` in the autograd context, which holds IValues: a capsule holds any class.
struct HeldFn : torch::CustomClassHolder {
  explicit HeldFn(CheckpointedFn f) : fn(std::move(f)) {}
  CheckpointedFn fn;
};

struct Checkpointed : torch::autograd::Function<Checkpointed> {
  // Runs with gradients off (autograd's rule for a Function's forward): no activations kept.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const CheckpointedFn& fn) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<HeldFn>(fn));
    ctx->saved_data["input_requires_grad"] = input.requires_grad();
    ctx->save_for_backward({input});
    return fn(input);
  }

  // The forward again, with gradients, then a backward through it: the re-entrant backward
  // accumulates into the parameters' .grad (their hooks run) and gives the input's gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto held = c10::static_intrusive_pointer_cast<HeldFn>(ctx->saved_data["fn"].toCapsule());
    const bool input_requires_grad = ctx->saved_data["input_requires_grad"].toBool();
    auto input = ctx->get_saved_variables()[0].detach().requires_grad_(input_requires_grad);
    torch::Tensor output;
    {
      torch::AutoGradMode enabled(true);
      output = held->fn(input);
    }
    if (output.requires_grad()) torch::autograd::backward({output}, {grads[0]});
    return {input_requires_grad ? input.grad() : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// GCC 14 with LibTorch 2.6 warns inside Function::apply, inlined here: -Warray-bounds and
// -Wstringop-overflow on the std::vector<bool>::reserve of its argument flags. They are false
// positives that a pragma here cannot silence (they are placed in the standard library's
// header); src/CMakeLists.txt turns them off for this file only.
torch::Tensor checkpoint(CheckpointedFn fn, const torch::Tensor& input) {
  return Checkpointed::apply(input, fn);
}

}  // namespace ddp
