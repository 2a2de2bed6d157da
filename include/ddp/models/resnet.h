#pragma once
// The d2l ResNet-18 of the multi-GPU tutorial, with the module names of its Python definition, so
// that weights move between the two with strict=True:
//   0 (3x3 conv, 64, stride 1), 1 (BatchNorm2d), 2 (ReLU), resnet_block1 .. resnet_block4 (two
//   Residuals each; 64, 128, 256, 512 channels; 1x1 conv shortcut with stride 2 at the first block
//   of stages 2-4), global_avg_pool, fc (Flatten, Linear 512 -> classes).
// No max-pool: the small-image variant the tutorial trains on Fashion-MNIST.

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>

namespace ddp::models {

// Makes the normalisation layer of `channels` channels; empty: torch::nn::BatchNorm2d. How
// --sync-bn puts a SyncBatchNorm in, without this layer knowing about process groups.
using NormFactory = std::function<torch::nn::AnyModule(int64_t channels)>;

// d2l's Residual: conv1, conv2, [conv3 (1x1 shortcut)], bn1, bn2, registered in Python's order.
class ResidualImpl : public torch::nn::Module {
 public:
  ResidualImpl(int64_t in_channels, int64_t out_channels, bool use_1x1conv = false,
               int64_t stride = 1, const NormFactory& norm = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::AnyModule bn1_, bn2_;
};
TORCH_MODULE(Residual);

// resnet18(num_classes, in_channels), with the tutorial's initialisation: the weights of every
// Conv2d and Linear drawn from N(0, 0.01^2) (biases keep PyTorch's default init).
torch::nn::Sequential make_resnet18(int64_t num_classes = 10, int64_t in_channels = 1,
                                    const NormFactory& norm = nullptr);

}  // namespace ddp::models
