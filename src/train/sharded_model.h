#pragma once
// --fsdp: the workload's model fully sharded (ddp/core/fully_shard.h), and what the training
// state needs of it that a replicated model gives by itself: its state in a checkpoint's forms
// (ShardedState, ddp/train/sharded_checkpoint.h: the optimizer's state in the per-parameter form a
// DDP run saves, so that a checkpoint is the same file either way and resumes on any number of
// ranks, sharded or not), and gradient clipping by the norm over every rank's shard. A private
// header of the train layer, used by TrainState.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/core/fully_shard.h"
#include "ddp/train/sharded_checkpoint.h"
#include "ddp/train/sharded_weights.h"
#include "ddp/train/state_dict.h"
#include "ddp/train/workload.h"

namespace ddp::train {

class ShardedModel {
 public:
  // Shards `workload`'s model over `group` by its units with `options` (a collective: rank 0's
  // weights are broadcast first).
  ShardedModel(const Workload& workload, std::shared_ptr<comm::ProcessGroup> group,
               FullyShardOptions options);

  // The shards, which the optimizer steps.
  std::vector<torch::Tensor> parameters() const { return model_->parameters(); }
  // `run` (the workload's forward) on `input` with the units gathered around their calls (and
  // the input and output cast as the options' policy says).
  torch::Tensor forward(const std::function<torch::Tensor(const torch::Tensor&)>& run,
                        const torch::Tensor& input) {
    return model_->forward_with(run, input);
  }

  // loss.backward(), a failure naming the unit (FullyShardedDataParallel::backward).
  void backward(const torch::Tensor& loss) { model_->backward(loss); }
  // FullyShardedDataParallel::set_requires_gradient_sync.
  void set_requires_gradient_sync(bool sync) { model_->set_requires_gradient_sync(sync); }
  // Each unit's times in the last iteration (the timeline's).
  std::vector<fsdp::UnitTimes> last_iteration() const { return model_->last_iteration(); }

  // Rank 0's buffers (BatchNorm's statistics) to every rank, as DDP's broadcast_buffers (a
  // collective).
  void broadcast_buffers();

  // model.pt alone, as the units are gathered (train::save_weights of a sharded model).
  void save_weights(const std::string& path, bool write, const std::string& prefix) {
    train::save_weights(*model_, path, write, prefix);
  }
  // The model's and the optimizer's state in a checkpoint's forms.
  ShardedState& state() { return *state_; }

  // Scales the shards' gradients so that their 2-norm over every rank is at most `max_norm`, as
  // torch.nn.utils.clip_grad_norm_ on the whole gradient (a collective).
  void clip_grad_norm(double max_norm) { model_->clip_grad_norm(max_norm); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::unique_ptr<FullyShardedDataParallel> model_;
  std::unique_ptr<ShardedState> state_;
};

}  // namespace ddp::train
