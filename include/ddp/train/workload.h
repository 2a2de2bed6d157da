#pragma once
// A workload: the datasets, the model and how to run it, built from a Config.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/data/dataset.h"
#include "ddp/data/time_series.h"
#include "ddp/models/resnet.h"
#include "ddp/train/config.h"

namespace ddp::train {

struct Workload {
  data::TensorDataset train_set;
  std::optional<data::TensorDataset> val_set;  // evaluated every eval-every epochs when present;
  data::TensorDataset test_set;                // then the test set only after the last epoch
  std::shared_ptr<torch::nn::Module> module;
  // The modules --fsdp shards and gathers one at a time (the others' parameters are sharded
  // together, as the root unit): the MLP's layers, ResNet-18's residual blocks, the Informer's
  // encoder, distilling and decoder layers.
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  std::function<torch::Tensor(const torch::Tensor& input)> forward;
  // The naive forecast of the time series, reported beside the model; empty elsewhere.
  std::function<torch::Tensor(const torch::Tensor& input)> naive;
};

// Loads the data and builds the model (on the CPU) for config.model / config.dataset.
// Model initialisation is seeded from config.seed. `norm` makes the BatchNorm layers (empty:
// plain BatchNorm; --sync-bn passes SyncBatchNorm's). Throws InputError on bad data.
Workload make_workload(const Config& config, const models::NormFactory& norm = nullptr);

// Mean loss of a batch: cross-entropy for classification, MSE for regression.
torch::Tensor compute_loss(data::Task task, const torch::Tensor& output,
                           const torch::Tensor& target);

}  // namespace ddp::train
