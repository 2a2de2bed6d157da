#pragma once
// A workload: the datasets, the model and how to run it, built from a Config.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>

#include "ddp/data/dataset.h"
#include "ddp/models/resnet.h"
#include "ddp/train/config.h"

namespace ddp::train {

struct Workload {
  data::TensorDataset train_set;
  data::TensorDataset test_set;
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor& input)> forward;
};

// Loads the data and builds the model (on the CPU) for config.model / config.dataset.
// Model initialisation is seeded from config.seed. `norm` makes the BatchNorm layers (empty:
// plain BatchNorm; --sync-bn passes SyncBatchNorm's). Throws InputError on bad data.
Workload make_workload(const Config& config, const models::NormFactory& norm = nullptr);

// Mean loss of a batch: cross-entropy for classification, MSE for regression.
torch::Tensor compute_loss(data::Task task, const torch::Tensor& output,
                           const torch::Tensor& target);

}  // namespace ddp::train
