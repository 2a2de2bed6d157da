#include "ddp/train/run_options.h"

#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "ddp/common/error.h"

namespace ddp::train {

FullyShardOptions fsdp_options(const Config& config) {
  auto dtype = [](const std::string& name) {
    return name == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  };
  MixedPrecisionPolicy policy;
  if (fsdp_mixed_precision(config)) {
    policy.param_dtype(dtype(config.fsdp_param_dtype));
    if (config.fsdp_reduce_dtype != "param-dtype") {
      policy.reduce_dtype(dtype(config.fsdp_reduce_dtype));
    }
    policy.output_dtype(torch::kFloat32);  // the loss in float32, as autocast computes it
  }
  return FullyShardOptions().mp_policy(policy).reshard_after_forward(config.reshard_after_forward);
}

c10::ScalarType autocast_dtype(Amp amp) {
  return amp == Amp::kFp16 ? torch::kHalf : torch::kBFloat16;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        const std::vector<torch::Tensor>& params) {
  switch (c.optimizer) {
    case Optimizer::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr)
                                                             .momentum(c.momentum)
                                                             .nesterov(c.nesterov)
                                                             .weight_decay(c.weight_decay));
    case Optimizer::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
    case Optimizer::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  throw Error(
      fmt::format("make_optimizer: no case for optimizer {}", static_cast<int>(c.optimizer)));
}

}  // namespace ddp::train
