#pragma once
// PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank
// Gradient Compression for Distributed Optimization", NeurIPS 2019), as a comm hook with the
// semantics of PyTorch's powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py, 1.13 and 2.x; a test compares the two on the same gradients):
//
//   auto state = std::make_shared<ddp::PowerSGDState>(group,
//       ddp::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10));
//   model->register_comm_hook(state, ddp::powersgd_hook);
//
// Per bucket and iteration, once `start_powerSGD_iter` iterations have run with the plain
// all-reduce:
//   1. error feedback: the bucket's gradients plus what compression lost last time;
//   2. each gradient viewed as a matrix n x m (rows: its first dimension) is compressed when
//      (n + m) * r * min_compression_rate < n * m, r = min(n, m, rank); the others (biases and
//      every 1-D tensor among them) are all-reduced uncompressed;
//   3. P = M Q (Q from the last iteration with warm start, else random), P summed over ranks and
//      orthogonalised, Q = M^T P summed over ranks and divided by the world size, M ~ P Q^T.
// Wire bytes per compressed matrix: (n + m) r values instead of n m.

#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>

#include "ddp/comm/process_group.h"
#include "ddp/core/comm_hook.h"

namespace ddp::core {

// PyTorch's PowerSGDState arguments, with its names and defaults.
struct PowerSGDOptions {
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  // Iterations of plain all-reduce first: PyTorch advises ~10 % of training. Above 1 with error
  // feedback or warm start (the buckets are rebuilt after the first iteration).
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  TORCH_ARG(double, min_compression_rate) = 2.0;
  TORCH_ARG(bool, use_error_feedback) = true;
  TORCH_ARG(bool, warm_start) = true;
  TORCH_ARG(double, orthogonalization_epsilon) = 0.0;
  TORCH_ARG(uint32_t, random_seed) = 0;  // the initial Q's, the same on every rank
};

class PowerSGDState {
 public:
  // Throws InputError for options PyTorch refuses (rank < 1, start_powerSGD_iter <= 1 with
  // error feedback or warm start).
  explicit PowerSGDState(std::shared_ptr<comm::ProcessGroup> group, PowerSGDOptions options = {});

  comm::ProcessGroup& group() { return *group_; }
  const PowerSGDOptions& options() const { return options_; }
  // Iterations seen so far (counted at the last bucket of each).
  int64_t iter() const { return iter_; }
  // Elements of the gradients PowerSGD handled, and what it sent for them (P, Q and the
  // uncompressed tensors), since the start: their ratio is the compression rate.
  int64_t numel_before_compression() const { return numel_before_; }
  int64_t numel_after_compression() const { return numel_after_; }

 private:
  friend FuturePtr powersgd_hook(PowerSGDState& state, GradBucket& bucket);
  void maybe_increase_iter(const GradBucket& bucket);
  // The seed of the next random Q: numpy's RandomState(random_seed).randint(1_000_000_000), as
  // PyTorch draws it (an int seed seeds numpy's MT19937 as std::mt19937 does).
  uint64_t next_seed();

  std::shared_ptr<comm::ProcessGroup> group_;
  PowerSGDOptions options_;
  std::mt19937 rng_;
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  std::map<size_t, torch::Tensor> error_;     // per bucket index
  std::map<size_t, torch::Tensor> p_memory_;  // per bucket index, all its P's back to back
  std::map<size_t, torch::Tensor> q_memory_;
};

// PyTorch's powerSGD_hook.
FuturePtr powersgd_hook(PowerSGDState& state, GradBucket& bucket);

// Orthonormalises the columns of `matrix` (n x r, r <= n) in place: Gram-Schmidt for r <= 2 or
// 16-bit dtypes (QR has no half-precision kernel), else QR; as PyTorch's _orthogonalize.
// `epsilon` is added to each column's norm before dividing (0: a zero column becomes NaN).
void orthogonalize(torch::Tensor matrix, double epsilon = 0.0);

}  // namespace ddp::core

namespace ddp {
using core::powersgd_hook;
using core::PowerSGDOptions;
using core::PowerSGDState;
}  // namespace ddp
