#include "ddp/models/resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include <string>

namespace ddp::models {
namespace {

// An nn::Sequential that can sit inside another: LibTorch's own has a templated forward(), which
// a Sequential cannot hold.
class BlockImpl : public torch::nn::SequentialImpl {
 public:
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Block);

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
}

torch::nn::AnyModule make_norm(const NormFactory& norm, int64_t channels) {
  return norm ? norm(channels) : torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
}

// d2l's resnet_block: `residuals` Residuals, the first one halving the size (and changing the
// channels through a 1x1 conv) unless it is the first stage.
Block resnet_block(int64_t in, int64_t out, int residuals, bool first_block,
                   const NormFactory& norm) {
  Block block;
  for (int i = 0; i < residuals; ++i) {
    if (i == 0 && !first_block) {
      block->push_back(Residual(in, out, /*use_1x1conv=*/true, /*stride=*/2, norm));
    } else {
      block->push_back(Residual(out, out, false, 1, norm));
    }
  }
  return block;
}

}  // namespace

ResidualImpl::ResidualImpl(int64_t in, int64_t out, bool use_1x1conv, int64_t stride,
                           const NormFactory& norm)
    : bn1_(make_norm(norm, out)), bn2_(make_norm(norm, out)) {
  // Registration order is state-dict order: Python's __init__ assigns conv1, conv2, conv3, bn1,
  // bn2.
  conv1_ = register_module("conv1", conv(in, out, 3, stride, 1));
  conv2_ = register_module("conv2", conv(out, out, 3, 1, 1));
  if (use_1x1conv) conv3_ = register_module("conv3", conv(in, out, 1, stride, 0));
  register_module("bn1", bn1_.ptr());
  register_module("bn2", bn2_.ptr());
}

torch::Tensor ResidualImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1_.forward(conv1_->forward(x)));
  y = bn2_.forward(conv2_->forward(y));
  y = y + (conv3_ ? conv3_->forward(x) : x);
  return torch::relu(y);
}

torch::nn::Sequential make_resnet18(int64_t num_classes, int64_t in_channels,
                                    const NormFactory& norm) {
  torch::nn::Sequential net;
  net->push_back("0", conv(in_channels, 64, 3, 1, 1));
  net->push_back("1", make_norm(norm, 64));
  net->push_back("2", torch::nn::ReLU());
  net->push_back("resnet_block1", resnet_block(64, 64, 2, /*first_block=*/true, norm));
  net->push_back("resnet_block2", resnet_block(64, 128, 2, false, norm));
  net->push_back("resnet_block3", resnet_block(128, 256, 2, false, norm));
  net->push_back("resnet_block4", resnet_block(256, 512, 2, false, norm));
  net->push_back("global_avg_pool",
                 torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({1, 1})));
  net->push_back("fc", Block(torch::nn::Flatten(), torch::nn::Linear(512, num_classes)));

  // The tutorial's init_weights: nn.init.normal_(m.weight, std=0.01) for Linear and Conv2d.
  torch::NoGradGuard no_grad;
  for (const auto& module : net->modules(/*include_self=*/false)) {
    if (module->as<torch::nn::Conv2d>() || module->as<torch::nn::Linear>()) {
      torch::nn::init::normal_(module->named_parameters(false)["weight"], 0.0, 0.01);
    }
  }
  return net;
}

}  // namespace ddp::models
