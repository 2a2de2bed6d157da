#pragma once
// --fsdp: the workload's model fully sharded (ddp/core/fully_shard.h), and what the training
// state needs of it that a replicated model gives by itself: its whole state dict (gathered), the
// optimizer's state in the per-parameter form a DDP run saves (so that a checkpoint is the same
// file either way and resumes on any number of ranks, sharded or not), and gradient clipping by
// the norm over every rank's shard. A private header of the train layer, used by TrainState.

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/core/fully_shard.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/sharded_weights.h"
#include "ddp/train/state_dict.h"
#include "ddp/train/workload.h"
#include "optimizer_state.h"

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

  // The whole model's state and the optimizer's, as a gathered checkpoint holds them, without
  // either whole in memory: placeholders (PtFileWriter::deferred) where the parameters and the
  // optimizer's element-wise tensors go, which write_gathered() fills. No collective.
  struct Deferred {
    std::string prefix;  // of the keys of `model`
    StateDict model;     // the parameters deferred, the buffers copies
    // The optimizer over the model's own parameters, serialized as a checkpoint's optimizer_state
    // with its element-wise tensors empty; they are in `optimizer_tensors` (Checkpoint's).
    std::string optimizer_state;
    StateDict optimizer_tensors;
  };
  Deferred deferred_state(const std::string& prefix, torch::optim::Optimizer* local,
                          const OptimizerFactory& make) const;
  // Each unit's parameters gathered in turn, then (`local` given) its optimizer state, each tensor
  // handed to `write` with its placeholder in `state` (rank 0's; `write` is null on the others),
  // and freed before the next unit's: a collective.
  void write_gathered(const Deferred& state, torch::optim::Optimizer* local,
                      const DeferredWrite& write);
  // model.pt alone, as the units are gathered (train::save_weights of a sharded model).
  void save_weights(const std::string& path, bool write, const std::string& prefix) {
    train::save_weights(*model_, path, write, prefix);
  }
  // Each rank's shards from a whole model's state (keys with or without `module.`); InputError
  // starting with `origin` on a mismatch.
  void load_state_dict(const StateDict& weights, const std::string& origin);

  // This rank's part of a checkpoint's per-parameter optimizer state (`state`, and the
  // element-wise tensors kept apart, `tensors`: Deferred's) into `local`, reading no more of
  // the saved tensors than that part.
  void load_unsharded_optimizer_state(torch::optim::Optimizer& local, const at::Tensor& state,
                                      const StateDict& tensors, const OptimizerFactory& make,
                                      const std::string& path);

  // --checkpoint-sharded. Copies of this rank's shards (one per unit) and of its buffers (keys
  // prefixed with `prefix`): what its file holds besides the optimizer (no collective).
  std::vector<torch::Tensor> shard_copies() const;
  StateDict buffer_copies(const std::string& prefix) const;
  // The model and `local`'s state from every rank's file of a sharded checkpoint (`files`, in rank
  // order, of any number of ranks): this rank's part of each unit's parameters and of each
  // element-wise optimizer state copied from the saved shards it overlaps (the rest is not read,
  // and one saved rank's optimizer is in memory at a time); the buffers rank 0's file's.
  // InputError naming `path` when the checkpoint is of another model.
  void load_shards(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                   const OptimizerFactory& make, const std::string& path);

  // Scales the shards' gradients so that their 2-norm over every rank is at most `max_norm`, as
  // torch.nn.utils.clip_grad_norm_ on the whole gradient (a collective).
  void clip_grad_norm(double max_norm) { model_->clip_grad_norm(max_norm); }

 private:
  // Where this rank's shard of unit `unit` begins in the unit's flat elements.
  int64_t begin_of(int unit) const;
  void load_shard_optimizers(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                             const OptimizerFactory& make, const std::string& path);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::unique_ptr<FullyShardedDataParallel> model_;
};

}  // namespace ddp::train
