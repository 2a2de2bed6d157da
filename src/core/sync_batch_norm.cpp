#include "ddp/core/sync_batch_norm.h"

#include <torch/torch.h>

#include "ddp/common/error.h"

namespace ddp {

SyncBatchNormImpl::SyncBatchNormImpl(int64_t num_features,
                                     std::shared_ptr<comm::ProcessGroup> group, double eps,
                                     double momentum)
    : group_(std::move(group)), eps_(eps), momentum_(momentum) {
  // BatchNorm's initial values and registration order (its state dict order).
  weight = register_parameter("weight", torch::ones({num_features}));
  bias = register_parameter("bias", torch::zeros({num_features}));
  running_mean = register_buffer("running_mean", torch::zeros({num_features}));
  running_var = register_buffer("running_var", torch::ones({num_features}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

torch::Tensor SyncBatchNormImpl::all_reduced(const torch::Tensor& local) {
  if (!group_ || group_->world_size() == 1) return local;
  auto summed = local.detach().clone();
  group_->all_reduce(summed, comm::ReduceOp::kSum)->wait();
  if (!local.requires_grad()) return summed;
  // The value is the global sum, the gradient goes to `local` unchanged, and the hook sums it
  // over the ranks: d(sum of all ranks' losses)/d(local) = the sum of every rank's d/d(global).
  auto group = group_;
  local.register_hook([group](torch::Tensor grad) {
    auto total = grad.clone();
    group->all_reduce(total, comm::ReduceOp::kSum)->wait();
    return total;
  });
  return local + (summed - local.detach());
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  DDP_CHECK(input.dim() >= 2 && input.size(1) == weight.size(0),
            "SyncBatchNorm: input of shape [N, C, ...] with C = num_features");
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                             momentum_, eps_, /*cudnn_enabled=*/true);
  }
  const int64_t channels = input.size(1);
  std::vector<int64_t> reduce_dims = {0};
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = channels;
  for (int64_t d = 2; d < input.dim(); ++d) reduce_dims.push_back(d);

  // One all-reduce for [sum, sum of squares, count]; uneven batches count correctly.
  const double count = static_cast<double>(input.numel() / channels);
  auto local = torch::cat({input.sum(reduce_dims), (input * input).sum(reduce_dims),
                           torch::full({1}, count, input.options())});
  auto global = all_reduced(local);
  auto n = global[2 * channels];
  auto mean = global.narrow(0, 0, channels) / n;
  auto var = global.narrow(0, channels, channels) / n - mean * mean;  // biased, as BatchNorm
  auto invstd = torch::rsqrt(var + eps_);
  auto output = (input - mean.view(shape)) * (invstd * weight).view(shape) + bias.view(shape);

  torch::NoGradGuard no_grad;
  // The unbiased variance for the running estimate, as BatchNorm; on the device, no sync.
  const auto total = n.detach();
  running_mean.mul_(1 - momentum_).add_(mean.detach(), momentum_);
  running_var.mul_(1 - momentum_).add_(var.detach() * total / (total - 1).clamp_min(1), momentum_);
  num_batches_tracked.add_(1);
  return output;
}

}  // namespace ddp
