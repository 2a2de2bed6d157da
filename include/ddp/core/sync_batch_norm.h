#pragma once
// BatchNorm whose batch statistics are those of the global batch: the per-channel sums are
// all-reduced in forward, and their gradients in backward, so that output and input gradients
// equal plain BatchNorm's on the concatenation of all ranks' batches (PyTorch's SyncBatchNorm).
// For small per-rank batches, where each rank's own statistics would be noisy.
//
// Its parameters and buffers carry BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked): weights move to and from a model with plain BatchNorm. Weight and bias
// gradients stay local; DDP averages them as any other gradient. Every rank must run the same
// sequence of SyncBatchNorm forwards and backwards (each is a collective).

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "ddp/comm/process_group.h"

namespace ddp {

class SyncBatchNormImpl : public torch::nn::Module {
 public:
  // `group` may be null (or of size 1): then it is plain BatchNorm.
  SyncBatchNormImpl(int64_t num_features, std::shared_ptr<comm::ProcessGroup> group,
                    double eps = 1e-5, double momentum = 0.1);

  // Input [N, C, ...]. Training mode: global batch statistics, running statistics updated
  // (with the unbiased global variance, as BatchNorm). Eval mode: the running statistics.
  torch::Tensor forward(const torch::Tensor& input);

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  // `local` summed over the ranks, with a gradient that is also summed over the ranks.
  torch::Tensor all_reduced(const torch::Tensor& local);

  std::shared_ptr<comm::ProcessGroup> group_;
  double eps_;
  double momentum_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace ddp
