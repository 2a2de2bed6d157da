#pragma once
// What a run's config makes for every mode of keeping the model: its optimizer, FSDP's options,
// autocast's dtype. Pure functions of the Config.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "ddp/core/fully_shard.h"
#include "ddp/train/config.h"

namespace ddp::train {

// The optimizer named by config.optimizer over `params`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        const std::vector<torch::Tensor>& params);

// fsdp's and hsdp's options: fsdp-param-dtype's and fsdp-reduce-dtype's mixed precision policy,
// reshard-after-forward.
FullyShardOptions fsdp_options(const Config& config);

// The dtype of --amp's autocast (bf16 or fp16).
c10::ScalarType autocast_dtype(Amp amp);

}  // namespace ddp::train
