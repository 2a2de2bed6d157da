#pragma once
// Comparing a model's parameters with a reference's, for the worker programs that check DDP
// against one process. Header-only: the workers link LibTorch but not the test support library.

#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace ddp::testing {

// The largest |p - q| over all tensors, each relative to the largest |q| of its tensor (at least
// 1e-6, so that an all-zero reference compares absolutely).
inline double max_relative_error(const std::vector<torch::Tensor>& p,
                                 const std::vector<torch::Tensor>& q) {
  double worst = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double scale = std::max(q[i].abs().max().item<double>(), 1e-6);
    worst = std::max(worst, (p[i] - q[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace ddp::testing
