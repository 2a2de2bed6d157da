#pragma once
// The training state: everything a checkpoint holds, as one object. How the ranks keep the model
// (the wrapper, the optimizer, what is reduced when: Config::parallel) is a ParallelMode's
// (src/train/parallel_mode.h); the TrainState holds what every mode shares: the step, where in an
// epoch the state stands, the RNG stream, the GradScaler (--amp fp16), the lr schedule, the batch
// per rank, and the order of a save. A checkpoint saves it and a resume sets it; an elastic heal
// sends it whole from one member and every other takes it, then compares digests. The Trainer owns
// one and runs the loop on it:
//
//   TrainState state(config, dist, workload, timeline);
//   state.build(/*init_sync=*/true);     // the mode's optimizer and wrapper (rank 0's weights)
//   state.resume();                      // config.resume's checkpoint, if any
//   ... forward and backward through state.mode() ...
//   state.optimizer_step();              // on the reduced gradients
//   state.count_step(seconds);
//   state.save({epoch, 0});              // rank 0 writes; every rank calls it
//
// Note [No collective in a rank-0 branch]
// A collective that rank 0 alone enters waits for the others until the timeout. So saving and
// resuming are called on every rank; the collectives they contain (gathering the RNG states,
// agreeing on success, on the checkpoint's epoch) run on every rank, and only the file writes are
// inside `if (is_main())`. A failure on one rank is turned into an error on all of them by
// agree_all_ok(), instead of leaving the others blocked in the next collective.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/grad_scaler.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/lr_schedule.h"
#include "ddp/train/run_options.h"
#include "ddp/train/timeline.h"
#include "ddp/train/workload.h"

namespace ddp::train {

class ParallelMode;  // how the ranks keep the model (src/train/parallel_mode.h)

// Where the training stands in an epoch: after its last counted step, or where a state was set
// (its start, a resume, a heal). Under --elastic, where the next generation goes on.
struct EpochPosition {
  int64_t epoch = 0;        // 0-based
  int64_t epoch_step = 0;   // steps of the epoch done
  int64_t epoch_steps = 0;  // of the whole epoch
  // The epoch's pass: its sample ids in strides over its world (shared, not copied), and how many
  // of them its steps trained.
  torch::Tensor sequence;
  int64_t trained = 0;
  torch::Tensor rest() const;  // the epoch's untrained ids (a copy)
};

// The sampler's sequence of `epoch` for `world` ranks over `samples` training samples (every
// rank's indices, interleaved): config.seed's shuffle, padded unless --uneven.
torch::Tensor epoch_sequence(const Config& config, int64_t samples, int64_t epoch, int64_t world);

class TrainState {
 public:
  // On `workload`'s model, in the mode config.parallel names; `config` (its mode resolved:
  // parallel_mode()), `dist` (whose group --elastic replaces), `workload` and `timeline`
  // (--timeline; may be null) outlive the state. Sets the batch per rank (--batch-size, or
  // --global-batch-size over the world: InputError when the world cannot share it). No collective.
  TrainState(const Config& config, const Distributed& dist, const Workload& workload,
             Timeline* timeline);
  ~TrainState();

  // --amp's check (InputError when LibTorch cannot run it here) and fp16's GradScaler, then the
  // mode's optimizer and wrapper (a collective unless `init_sync` is false: it checks the model is
  // the same everywhere and broadcasts rank 0's weights).
  void build(bool init_sync);
  // The lr schedule for the batch per rank now (--lr-scaling); after a resume or a heal.
  void set_schedule();

  // How the ranks keep the model: forward, backward, accumulation, evaluation.
  ParallelMode& mode() { return *mode_; }
  // --amp fp16's GradScaler (null without).
  amp::GradScaler* scaler() { return scaler_.get(); }
  const LrSchedule& schedule() const { return schedule_; }
  int64_t step() const { return step_; }  // optimizer steps taken
  // A step applied, which took `step_seconds`; then the mode's own work after it (a trial of
  // --bucket-cap-mb auto; every --sync-every steps, DiLoCo's synchronization: a collective).
  void count_step(double step_seconds);
  // --uneven: the steps this rank joined at the epoch's end, counted as the others count them.
  void skip_steps(int64_t steps) { step_ += steps; }
  // The batch per rank now, for its world: the config's, a checkpoint's for a new world, or the
  // group's after an elastic change. The config stays as the user wrote it.
  int64_t batch_size() const { return batch_size_; }
  // Where the state was set (no step counted since): its start, a resume, a heal.
  EpochPosition position() const;
  // The ids of the epoch position() is in that are still to train (undefined: the whole epoch).
  const torch::Tensor& untrained() const { return start_epoch_samples_; }

  // The learning rate of every parameter group of the optimizer that steps.
  void set_lr(double lr);
  // The optimizer step on the reduced gradients (the mode's, with the GradScaler), under a label
  // of its own for its collectives.
  void optimizer_step();

  // Writes checkpoint-epoch-N[-step-S].pt, checkpoint.pt and model.pt (rank 0), then a barrier
  // (every rank calls it: see Note [No collective in a rank-0 branch]). In the middle of an
  // epoch, `untrained` holds its ids not yet trained. Returns the file and where it stands
  // ("<dir>/checkpoint-epoch-0002.pt (after epoch 2)"; rank 0's file, "" elsewhere). The order:
  // the shared part (the position, every rank's RNG state: a collective, the GradScaler's), then
  // the mode's (its model and optimizer, and how the files are written: fsdp_mode.h's sharded
  // checkpoint writes each rank's file of `<dir>/checkpoint-epoch-N.shards/`).
  std::string save(CheckpointPosition at, const torch::Tensor& untrained = {});
  // After the training's last save (every rank): the mode's (--checkpoint-sharded's last write
  // settled, and model.pt written gathered).
  void finish_saving();
  // Loads the checkpoint config.resume names (none: nothing to do), on every rank; returns false
  // when there is none to load (`auto` finds none).
  bool resume();

  // Under --elastic. The state at `at`, as a checkpoint of a world of `world` ranks that another
  // member can take (the heal's message).
  Checkpoint to_send(const EpochPosition& at, int world);
  // A state another member sent, as a resume would; `origin` names where it came from.
  void take(const Checkpoint& state, const std::string& origin);
  // Equal on two members only when their states are (bar a 64-bit collision).
  uint64_t digest();
  // Before the generation's group goes: drop every use of it (the mode's, the GradScaler's).
  void release_group();
  // The new generation's group (the Distributed's): the mode's wrapper on it without DDP's
  // broadcast (Note [One state transfer per change] in elastic_member.h), the GradScaler's check.
  void adopt_group();

 private:
  // Sets the state to `checkpoint` (read from `path`): the batch per rank it keeps, the mode's
  // model and optimizer, the GradScaler and the RNG stream, the step and the position. A sharded
  // checkpoint's: `checkpoint` is rank 0's file, `shard_files` every rank's.
  void apply(const Checkpoint& checkpoint, const std::string& path,
             const std::vector<Checkpoint>* shard_files = nullptr);

  const Config& config_;
  const Distributed& dist_;
  const Workload& workload_;
  Timeline* timeline_;
  std::unique_ptr<ParallelMode> mode_;
  std::unique_ptr<amp::GradScaler> scaler_;  // --amp fp16
  LrSchedule schedule_;
  int64_t step_ = 0;                   // optimizer steps taken
  int64_t start_epoch_ = 0;            // epochs done before this run (resume)
  int64_t start_epoch_step_ = 0;       // steps of epoch start_epoch_ done before it (a SIGTERM's)
  torch::Tensor start_epoch_samples_;  // and the ids of it still to train (undefined: none)
  // The batch per rank now (batch_size()), for batch_world_ ranks.
  int64_t batch_size_ = 0;
  int64_t batch_world_ = 1;
};

}  // namespace ddp::train
