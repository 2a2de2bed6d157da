#pragma once
// The small built-in models, as torch::nn::Sequential so that their parameter names ("1.weight",
// "3.bias", ...) equal those of the same nn.Sequential in Python.

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>

namespace ddp::models {

// Python: nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
//                       nn.ReLU(), nn.Linear(256, 10))
torch::nn::Sequential make_mlp(int64_t in_features = 784, int64_t num_classes = 10);

// An MLP as wide and deep as asked, for memory measurements (bench/fsdp_memory.py): Flatten, then
// `depth` Linear(width) layers each followed by ReLU, then Linear(width, num_classes).
torch::nn::Sequential make_wide_mlp(int64_t in_features, int64_t num_classes, int64_t width,
                                    int64_t depth);

// The DataParallel tutorial's model. Python: nn.Sequential(nn.Linear(5, 2))
torch::nn::Sequential make_linear(int64_t in_features = 5, int64_t out_features = 2);

}  // namespace ddp::models
