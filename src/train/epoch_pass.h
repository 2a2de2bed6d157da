#pragma once
// One epoch's training pass (private to the train layer): the sample ids it trains, this rank's
// loader over its share, its counts and its progress line. The Trainer begins one per epoch and
// counts its steps on it.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "ddp/data/loader.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/progress.h"
#include "ddp/train/train_state.h"
#include "ddp/train/workload.h"

namespace ddp::train {

struct EpochPass {
  int64_t epoch = 0;  // 0-based
  int64_t steps = 0;  // optimizer steps of the whole epoch: the same on every rank
  int64_t step = 0;   // steps of this epoch done (a resumed epoch starts after the checkpoint's)
  int64_t first_step = 0;  // the step this pass started after
  // The sample ids this pass trains, in strides over the ranks (see Note [An epoch is a sequence
  // the ranks take in strides]): the epoch's whole sequence, or a resumed epoch's rest.
  torch::Tensor sequence;
  torch::Tensor order;      // this rank's ids, in the order its loader takes them
  int64_t per_step = 0;     // samples a step takes from `order` (the batch x --grad-accum-steps)
  bool first = false;       // the run's first step: its shapes are logged
  bool pin_memory = false;  // pinned batches: copied to the GPU without blocking
  int64_t trained = 0;      // samples
  int64_t grad_bytes = 0;   // handed to the gradients' collectives by this rank
  torch::Tensor loss_sum;   // on the device, so the loop never waits for it
  std::chrono::steady_clock::time_point start;
  std::unique_ptr<data::BatchLoader> loader;
  std::optional<EpochProgress> progress;

  // After a step that trained on `samples` whose losses sum to `losses` (float64).
  void count_step(const torch::Tensor& losses, int64_t samples);
  // rank 0's shard only: no collective for a progress line
  double running_loss() const;
  // This rank's ids of the step in flight (not counted yet): its loader takes them from `order`,
  // a step's batches at a time.
  torch::Tensor step_ids() const;
  // Where the pass stands after its counted steps on a world of `world` ranks: where the next
  // generation goes on (--elastic), or what a checkpoint in the middle of the epoch keeps.
  EpochPosition position(int64_t world) const;
};

// The pass of `epoch` (0-based) for this rank, from `state`'s position: a resumed epoch trains
// the rest its checkpoint left, shared by this world; the others their sampler's sequence.
// InputError when --drop-last leaves a rank no batch.
EpochPass begin_epoch(const Config& config, const Distributed& dist, const Workload& workload,
                      const TrainState& state, ProgressStyle progress, int64_t epoch);

}  // namespace ddp::train
