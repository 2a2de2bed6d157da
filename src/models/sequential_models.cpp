#include "ddp/models/sequential_models.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

namespace ddp::models {

torch::nn::Sequential make_mlp(int64_t in_features, int64_t num_classes) {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(in_features, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, 256), torch::nn::ReLU(),
                               torch::nn::Linear(256, num_classes));
}

torch::nn::Sequential make_linear(int64_t in_features, int64_t out_features) {
  return torch::nn::Sequential(torch::nn::Linear(in_features, out_features));
}

}  // namespace ddp::models
