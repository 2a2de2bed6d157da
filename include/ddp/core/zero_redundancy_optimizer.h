#pragma once
// ZeRO stage 1, as PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer: the optimizer
// state is sharded over the ranks. Each parameter has one owner rank; each rank's local
// optimizer holds only its own parameters (and so only their state: Adam's two moments are
// 1/world of the model's, not all of it), steps them with the all-reduced gradients, and then
// every parameter is broadcast from its owner, so that all ranks hold the same model again.
//
//   ddp::ZeroRedundancyOptimizer optimizer(
//       model->parameters(), group, [](std::vector<torch::Tensor> shard) {
//         return std::make_unique<torch::optim::Adam>(shard, torch::optim::AdamOptions(1e-3));
//       });
//   ... loss.backward();   // DDP all-reduces every gradient, as usual
//   optimizer.step();      // this rank's shard, then the broadcasts (a collective)
//
// Element-wise optimizers (SGD, Adam, AdamW, ...) then train exactly as unsharded ones.

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp {

// PyTorch's partition: parameters by size, largest first (ties in order), each to the rank
// holding the fewest elements so far (the lowest such rank). Returns each parameter's owner.
std::vector<int> partition_parameters(const std::vector<int64_t>& numels, int world_size);

class ZeroRedundancyOptimizer {
 public:
  using OptimizerFactory =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

  // `params`: the same parameters in the same order on every rank (DDP's are).
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> params,
                          std::shared_ptr<comm::ProcessGroup> group, const OptimizerFactory& make);

  // Steps this rank's shard, then broadcasts each rank's shard from it (a collective).
  void step();
  // Drops every parameter's gradient (not only the shard's).
  void zero_grad();

  // The optimizer of this rank's shard: its learning rate, its state (for checkpoints).
  torch::optim::Optimizer& local() { return *local_; }
  const std::vector<int>& owners() const { return owners_; }
  // The local optimizer's state as torch::save writes it, in bytes: what sharding saves.
  int64_t local_state_bytes() const;

 private:
  std::vector<torch::Tensor> params_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<int> owners_;
  std::vector<std::vector<torch::Tensor>> shards_;  // per rank, its parameters in order
  std::unique_ptr<torch::optim::Optimizer> local_;
};

}  // namespace ddp
