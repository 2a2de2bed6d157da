#pragma once
// The side of tests/python/diloco_reference.py that our tests replay: its file of tensors, and
// one inner step of a replica (plain SGD on the mean squared error of a linear model, float64).
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"

namespace ddp::testing::diloco {

inline constexpr int kRounds = 3, kH = 4, kDelay = 2;
inline constexpr double kInnerLr = 0.05;

// The reference's tensors by name ("W0", "x.<worker>.<step>", "diloco.<round>.W", ...).
inline std::map<std::string, at::Tensor> read_reference(const std::string& file) {
  std::map<std::string, at::Tensor> out;
  for (auto& [key, tensor] : ddp::train::state_dict_from(ddp::train::read_pt_file(file), file)) {
    out[key] = tensor;
  }
  return out;
}

// One inner step on `w` = {W, b}, in place, on worker `i`'s batch `step`.
inline void inner_step(std::vector<at::Tensor>& w, const std::map<std::string, at::Tensor>& ref,
                       int i, int step) {
  const auto& x = ref.at("x." + std::to_string(i) + "." + std::to_string(step));
  const auto& y = ref.at("y." + std::to_string(i) + "." + std::to_string(step));
  for (auto& p : w) p.requires_grad_(true);
  auto loss = (x.matmul(w[0].t()) + w[1] - y).pow(2).mean();
  const auto grads = torch::autograd::grad({loss}, {w[0], w[1]});
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < w.size(); ++k) w[k].sub_(grads[k] * kInnerLr);
}

// The largest absolute difference of `got` from the reference's round `round` of `variant`.
inline double round_error(const std::vector<at::Tensor>& got,
                          const std::map<std::string, at::Tensor>& ref, const std::string& variant,
                          int round) {
  const std::string key = variant + "." + std::to_string(round);
  return std::max((got[0].detach() - ref.at(key + ".W")).abs().max().item<double>(),
                  (got[1].detach() - ref.at(key + ".b")).abs().max().item<double>());
}

}  // namespace ddp::testing::diloco
