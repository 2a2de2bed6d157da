#pragma once
// Activation checkpointing, as PyTorch's torch.utils.checkpoint.checkpoint(fn, x) with
// use_reentrant=True (PyTorch 1.13's default):
//
//   auto y = ddp::checkpoint([&](const torch::Tensor& h) { return block->forward(h); }, x);
//
// The forward runs `fn` without keeping its activations (only x is kept); the backward runs `fn`
// on x again, with gradients, and backpropagates through it inside the outer backward. The
// parameters `fn` uses get their gradients from that inner backward, so under
// DistributedDataParallel a block checkpointed more than once per iteration gives its parameters
// gradients more than once per backward: that needs static_graph (distributed_data_parallel.h).
// `fn` runs twice: it must compute the same thing both times (no dropout: the random state is
// not replayed here, unlike PyTorch's preserve_rng_state).

#include <torch/types.h>

#include <functional>

namespace ddp {

using CheckpointedFn = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor checkpoint(CheckpointedFn fn, const torch::Tensor& input);

}  // namespace ddp
