#include "ddp/models/sequential_models.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

namespace ddp::models {

torch::nn::Sequential make_mlp(int64_t in_features, int64_t num_classes) {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(in_features, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, 256), torch::nn::ReLU(),
                               torch::nn::Linear(256, num_classes));
}

torch::nn::Sequential make_wide_mlp(int64_t in_features, int64_t num_classes, int64_t width,
                                    int64_t depth) {
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(in_features, width),
                            torch::nn::ReLU());
  for (int64_t i = 1; i < depth; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(torch::nn::Linear(width, num_classes));
  return net;
}

torch::nn::Sequential make_linear(int64_t in_features, int64_t out_features) {
  return torch::nn::Sequential(torch::nn::Linear(in_features, out_features));
}

}  // namespace ddp::models
