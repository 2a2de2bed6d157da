#pragma once
// A fully sharded model's state (ddp/core/fully_shard.h) for checkpoints, for ddp_train --fsdp and
// for a LibTorch program of its own: the optimizer's state gathered into the per-parameter form an
// optimizer over the whole model holds, and taken back on any number of ranks; each rank's own
// file of a sharded checkpoint written on a thread beside training, as PyTorch DCP's async_save;
// or one file, DDP's and Python's, written by rank 0 as the units are gathered one at a time. No
// rank holds the whole model or the whole optimizer state.
//
//   // An optimizer of the run's kind over given tensors (SGD, Adam or AdamW): the state is
//   // converted through it between the shards of any world size and the per-parameter form.
//   auto make = [](const std::vector<torch::Tensor>& params) {
//     return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
//   };
//   ddp::train::ShardedCheckpoint checkpoint(model, optimizer, make, group);
//   checkpoint.save_async("ckpt/step-100");    // returns once this rank's state is copied
//   ...                                        // training goes on while the files are written
//   checkpoint.wait();                         // every rank's file written (a collective)
//   checkpoint.save("ckpt/step-200");          // the same, no copy: written before it returns
//   checkpoint.save_gathered("checkpoint.pt"); // one file, as DDP's checkpoint.pt
//   checkpoint.load("ckpt/step-100");          // either kind, on any number of ranks

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/core/fully_shard.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/sharded_weights.h"
#include "ddp/train/state_dict.h"

namespace ddp::train {

// An optimizer of the run's kind over the parameters given.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)>;

// The model's and its optimizer's state in a checkpoint's forms. The optimizer steps the shards:
// model.parameters() (not named_parameters()).
class ShardedState {
 public:
  // `model` over `group` (both outlive this).
  ShardedState(FullyShardedDataParallel& model, std::shared_ptr<comm::ProcessGroup> group);

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
  // Each rank's shards from a whole model's state (keys with or without `module.`); InputError
  // starting with `origin` on a mismatch.
  void load_state_dict(const StateDict& weights, const std::string& origin);
  // This rank's part of a checkpoint's per-parameter optimizer state (`state`, and the
  // element-wise tensors kept apart, `tensors`: Deferred's) into `local`, reading no more of
  // the saved tensors than that part.
  void load_unsharded_optimizer_state(torch::optim::Optimizer& local, const at::Tensor& state,
                                      const StateDict& tensors, const OptimizerFactory& make,
                                      const std::string& path);

  // This rank's file of a sharded checkpoint into `c` (no collective): its shard_rank, copies of
  // its buffers, its shards (FullyShardedDataParallel::flat_shards: one per unit, then the frozen
  // parts') and `local`'s state over them, its element-wise tensors apart (Checkpoint's
  // optimizer_tensors), so that the file is written from where they lie. With `copy`, copies of
  // the shards and of those tensors, for a write beside training (3/N of the model's bytes under
  // Adam); without, the tensors themselves, for a write before the next step (no copy at all).
  void fill_rank_file(Checkpoint& c, const torch::optim::Optimizer& local,
                      const OptimizerFactory& make, bool copy) const;
  // The model and `local`'s state from every rank's file of a sharded checkpoint (`files`, in rank
  // order, of any number of ranks): this rank's part of each unit's parameters and of each
  // element-wise optimizer state copied from the saved shards it overlaps (the rest is not read,
  // and one saved rank's optimizer is in memory at a time); the buffers rank 0's file's.
  // InputError naming `path` when the checkpoint is of another model.
  void load_shards(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                   const OptimizerFactory& make, const std::string& path);

 private:
  // Where this rank's shard of unit `unit` begins in the unit's flat elements.
  int64_t begin_of(int unit) const;
  void load_shard_optimizers(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                             const OptimizerFactory& make, const std::string& path);

  FullyShardedDataParallel& model_;
  torch::nn::Module& module_;
  std::shared_ptr<comm::ProcessGroup> group_;
};

// Checkpoints of a sharded model and its optimizer, as at the top of this file. Every call is a
// collective but the constructor. An error on any rank (a file that cannot be written or read)
// is thrown on every rank once the collectives are done, so that none is left waiting.
class ShardedCheckpoint {
 public:
  // `model`, `optimizer` (over model.parameters(); InputError otherwise) and `group` outlive
  // this.
  ShardedCheckpoint(FullyShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                    OptimizerFactory make, std::shared_ptr<comm::ProcessGroup> group);
  ~ShardedCheckpoint();  // waits for the write in flight; its error is dropped
  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  // Directory `dir` (made where missing), each rank's file in it ("rank-00002-of-00004.pt"),
  // written on a thread of its own from a copy of the rank's shards, buffers and optimizer state:
  // returns once the copy is taken. The previous save is waited for first.
  void save_async(const std::string& dir);
  // The same written before returning, from the state itself: no copy, no memory beyond
  // training's (PyTorch DCP's save). Agrees that every rank's write succeeded.
  void save(const std::string& dir);
  // Waits for this rank's write and agrees that every rank's succeeded (throws otherwise).
  void wait();
  // One file at `path`, a checkpoint whose model and optimizer state are DDP's (keys with
  // `module.`), written by rank 0 as the units are gathered one at a time.
  void save_gathered(const std::string& path);
  // The model's and the optimizer's state from a sharded checkpoint's directory of any number of
  // ranks, or from a gathered checkpoint's file (this rank's part of each tensor only).
  void load(const std::string& path);

 private:
  struct Writer;  // the thread that writes this rank's file
  void start_save(const std::string& dir, bool background);
  // Every rank: throws when `error` is set on any rank (its own error where it has one).
  void agree(std::exception_ptr error, const std::string& what);
  void read_into_this_rank(const std::string& path);

  ShardedState state_;
  torch::optim::Optimizer& optimizer_;
  OptimizerFactory make_;
  std::shared_ptr<comm::ProcessGroup> group_;
  c10::Device device_;  // the model's: the agreements' tensors go there (NCCL: CUDA only)
  std::unique_ptr<Writer> writer_;
  std::string writing_;  // the directory being written ("": none)
};

}  // namespace ddp::train
