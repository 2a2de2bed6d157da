#pragma once
// Training checkpoints: everything a run needs to continue exactly where it stopped, in a file
// Python's torch.load(weights_only=True) also reads, and the decisions around them (file names,
// which to keep, which to resume from, how a new world size keeps the global batch).

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/core/grad_scaler.h"
#include "ddp/train/state_dict.h"

namespace ddp::train {

struct Checkpoint {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken: the lr schedule's position
  // Steps taken in epoch `epoch` (0-based) when it was saved in the middle of that epoch
  // (--checkpoint-on-signal); 0 for one saved at an epoch's end.
  int64_t epoch_step = 0;
  // With epoch_step: the epoch's sample ids not yet trained, in the order they are due (int64; see
  // Note [An epoch is a sequence the ranks take in strides]), so that a resume on any world size
  // trains each of them once. Undefined at an epoch's end, and in checkpoints older than it.
  at::Tensor epoch_samples;
  int64_t world_size = 1;
  int64_t batch_size = 0;      // per rank; 0: no training run's (ShardedCheckpoint's)
  int64_t seed = 0;            // the sampler's and the model's seed
  std::string optimizer;       // sgd, adam, adamw
  std::string config;          // the resolved config of the run, YAML
  StateDict model;             // keys with `module.`, as in model.pt
  at::Tensor optimizer_state;  // uint8: the optimizer's own serialization (momentum, Adam moments)
  // Under --fsdp, the element-wise tensors of optimizer_state (which holds them empty) kept apart,
  // so that rank 0 writes them unit by unit and each rank reads only its part:
  // "<parameter index>.<name>" (optimizer_tensor_key, "3.exp_avg") -> a 1-D tensor.
  StateDict optimizer_tensors;
  // --zero: each rank's shard of the optimizer, serialized as optimizer_state is (which is then
  // empty); a ZeRO run resumes on as many ranks as saved it.
  std::vector<at::Tensor> optimizer_shards;
  at::Tensor rng_state;  // uint8 [world_size, n]: each rank's CPU generator state
  // --amp fp16: the GradScaler's state (the same on every rank), under "grad_scaler" with
  // PyTorch's state_dict keys, its floats as 0-d float64 tensors.
  std::optional<amp::GradScalerState> grad_scaler;
  // --sync local-sgd, diloco: each rank's inner optimizer, serialized as optimizer_state is (the
  // ranks' differ: each trains alone between synchronizations), and the outer optimizer's
  // momentum buffers by parameter index ("0", "1", ...; the same on every rank). A checkpoint is
  // written after the epoch's synchronization, so the model is every rank's.
  std::vector<at::Tensor> inner_optimizers;
  StateDict outer_momentum;
  // --bucket-cap-mb auto: the bucket size the first steps chose, in bytes (0: none chosen yet), so
  // that a resume trains with it instead of tuning again.
  int64_t bucket_cap_bytes = 0;
  // One rank's file of a sharded checkpoint (--checkpoint-sharded, under --fsdp; 0 and up, -1 for
  // a whole checkpoint): that rank's shard of each unit's flat parameters, in the model's unit
  // order, then of each unit's frozen part (FullyShardedDataParallel::flat_shards). `model` then
  // holds the rank's buffers only and optimizer_state its optimizer over the shards, whose
  // element-wise tensors are in optimizer_tensors keyed by unit ("2.exp_avg": unit 2's shard's),
  // or (files written before they were kept apart) in optimizer_state itself; the rest
  // (rng_state: every rank's) is the same in every rank's file.
  int64_t shard_rank = -1;
  std::vector<at::Tensor> parameter_shards;
};

// As a dict of ints, strings and tensors (no floats: Python 1.13's weights-only loader refuses
// them), with "format": "ddp.checkpoint" and "version": 1.
c10::IValue to_ivalue(const Checkpoint& checkpoint);

// Throws InputError starting with `origin` when `contents` is not a complete checkpoint.
Checkpoint checkpoint_from(const c10::IValue& contents, const std::string& origin);

Checkpoint read_checkpoint(const std::string& path);

// Where a checkpoint is in the run: epochs completed, then steps into the next one.
struct CheckpointPosition {
  int64_t epoch = 0;
  int64_t epoch_step = 0;
  bool operator<(const CheckpointPosition& o) const {
    return epoch != o.epoch ? epoch < o.epoch : epoch_step < o.epoch_step;
  }
  bool operator==(const CheckpointPosition& o) const {
    return epoch == o.epoch && epoch_step == o.epoch_step;
  }
};

// "checkpoint-epoch-0003.pt" after 3 epochs, "checkpoint-epoch-0003-step-000042.pt" 42 steps
// into the 4th, and back (nullopt for any other name); a sharded checkpoint's directory ends in
// ".shards" instead of ".pt".
std::string checkpoint_file_name(CheckpointPosition position, bool sharded = false);
std::optional<CheckpointPosition> checkpoint_file_position(const std::string& file_name);

// In a sharded checkpoint's directory: "rank-00002-of-00004.pt".
std::string shard_file_name(int64_t rank, int64_t world_size);

// The numbered checkpoints in `dir` (files and sharded directories), newest first (paths).
std::vector<std::string> list_checkpoints(const std::string& dir);

// The files of the sharded checkpoint in directory `dir`, in rank order. InputError naming the
// directory and the file when one is missing (a rank stopped while it wrote: the checkpoint is
// incomplete), unreadable, or of another checkpoint.
std::vector<Checkpoint> read_sharded_checkpoint(const std::string& dir);

// The ones to delete so that the `keep_last` newest remain.
std::vector<std::string> stale_checkpoints(const std::vector<std::string>& newest_first,
                                           int64_t keep_last);

// Deletes the numbered checkpoints of `dir` that stale_checkpoints() names (files and sharded
// directories); what cannot be deleted stays.
void remove_stale_checkpoints(const std::string& dir, int64_t keep_last);

// The per-rank batch size that keeps the global batch (batch x saved_world) on `world` ranks;
// nullopt when the global batch is not a multiple of `world`.
std::optional<int64_t> batch_size_for_world(int64_t batch, int64_t saved_world, int64_t world);

// "key: old -> new" for each key whose value differs between two to_yaml() outputs, except the
// keys in `ignored`.
std::vector<std::string> changed_settings(const std::string& saved_yaml,
                                          const std::string& current_yaml,
                                          const std::vector<std::string>& ignored);

}  // namespace ddp::train
