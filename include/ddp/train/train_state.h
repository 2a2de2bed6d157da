#pragma once
// The training state: everything a checkpoint holds, as one object. The model (and its DDP wrapper
// on the group), the optimizer (--zero's shard), the GradScaler (--amp fp16), the DiLoCo state
// (--sync local-sgd, diloco), the step, where in an epoch the state stands, the batch per rank and
// the RNG stream. A checkpoint saves it and a resume sets it; an elastic heal sends it whole from
// one member and every other takes it, then compares digests. The Trainer owns one and runs the
// loop on it:
//
//   TrainState state(config, dist, workload, timeline);
//   state.build(/*init_sync=*/true);     // the optimizer, DDP (rank 0's weights broadcast)
//   state.resume();                      // config.resume's checkpoint, if any
//   ... forward and backward through state.model() ...
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

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/bucket_tuning.h"
#include "ddp/core/diloco.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/fully_shard.h"
#include "ddp/core/grad_scaler.h"
#include "ddp/core/zero_redundancy_optimizer.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/lr_schedule.h"
#include "ddp/train/timeline.h"
#include "ddp/train/workload.h"

namespace ddp::train {

class ShardedModel;             // --fsdp (src/train/sharded_model.h)
class ShardedCheckpointWriter;  // --checkpoint-sharded (src/train/sharded_checkpoint_writer.h)

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

// The optimizer named by config.optimizer over `params`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        const std::vector<torch::Tensor>& params);

// --fsdp's options: fsdp-param-dtype's and fsdp-reduce-dtype's mixed precision policy,
// reshard-after-forward.
FullyShardOptions fsdp_options(const Config& config);

// The dtype of --amp's autocast (bf16 or fp16).
c10::ScalarType autocast_dtype(Amp amp);

// The sampler's sequence of `epoch` for `world` ranks over `samples` training samples (every
// rank's indices, interleaved): config.seed's shuffle, padded unless --uneven.
torch::Tensor epoch_sequence(const Config& config, int64_t samples, int64_t epoch, int64_t world);

class TrainState {
 public:
  // On `workload`'s model; `config`, `dist` (whose group --elastic replaces), `workload` and
  // `timeline` (--timeline; may be null) outlive the state. Sets the batch per rank (--batch-size,
  // or --global-batch-size over the world: InputError when the world cannot share it). No
  // collective.
  TrainState(const Config& config, const Distributed& dist, const Workload& workload,
             Timeline* timeline);
  ~TrainState();

  // --amp's check (InputError when LibTorch cannot run it here) and fp16's GradScaler, the
  // optimizer, DDP's wrapper on the group (a collective unless `init_sync` is false: it checks the
  // model is the same everywhere and broadcasts rank 0's weights), --sync's DiLoCo, --zero's.
  void build(bool init_sync);
  // The lr schedule for the batch per rank now (--lr-scaling); after a resume or a heal.
  void set_schedule();

  // The model with its DDP wrapper (not under --fsdp); --amp fp16's GradScaler and --sync's DiLoCo
  // (null without).
  DistributedDataParallel<>& model() { return model_; }
  // --fsdp: the model is sharded (no DDP wrapper); its units' times in the last iteration.
  bool sharded() const { return sharded_ != nullptr; }
  std::vector<fsdp::UnitTimes> unit_times() const;
  // --fsdp: whether the next backwards reduce-scatter their gradients (false: kept whole and
  // added up until one that does; FullyShardedDataParallel::set_requires_gradient_sync).
  void set_requires_gradient_sync(bool sync);
  // The gradients dropped before a step's first backward.
  void zero_grad();
  // The workload's forward on `input` through the wrapper: DDP's, or --fsdp's gathers around each
  // unit (then a collective: every rank runs as many forwards; the output in float32 whatever
  // fsdp-param-dtype), with broadcast-buffers' broadcast of rank 0's buffers before a training
  // forward in both (DDP: the first after a backward).
  torch::Tensor forward(const torch::Tensor& input);
  // loss.backward(); --fsdp: an error in it names the unit whose backward ran.
  void backward(const torch::Tensor& loss);
  // Before an evaluation's forwards: rank 0's buffers to every rank (broadcast-buffers; a
  // collective).
  void before_evaluation();
  amp::GradScaler* scaler() { return scaler_.get(); }
  DiLoCo* diloco() { return diloco_.get(); }
  const LrSchedule& schedule() const { return schedule_; }
  int64_t step() const { return step_; }  // optimizer steps taken
  // A step applied, which took `step_seconds`; then the state's own work after it: a trial of
  // --bucket-cap-mb auto, and every --sync-every steps --sync's synchronization (a collective).
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
  // The optimizer step on the reduced gradients: --amp fp16's unscale and inf check (the step is
  // then skipped on every rank), --clip-grad-norm, then the step (--zero: this rank's shard,
  // broadcast to the others).
  void optimizer_step();
  // --bucket-cap-mb auto: the size a checkpoint kept, or the trials from the first step on
  // (count_step() records each).
  void start_bucket_tuning();

  // Writes checkpoint-epoch-N[-step-S].pt, checkpoint.pt and model.pt (rank 0), then a barrier
  // (every rank calls it: see Note [No collective in a rank-0 branch]). In the middle of an
  // epoch, `untrained` holds its ids not yet trained. Returns the file and where it stands
  // ("<dir>/checkpoint-epoch-0002.pt (after epoch 2)"; rank 0's file, "" elsewhere).
  // --checkpoint-sharded: each rank writes its own file of `<dir>/checkpoint-epoch-N.shards/` in
  // the background instead, after a copy of its shards and optimizer state (the save waits only
  // for that; the previous save is settled first: sharded_checkpoint_writer.h).
  std::string save(CheckpointPosition at, const torch::Tensor& untrained = {});
  // After the training's last save (every rank): --checkpoint-sharded's last write settled, and
  // model.pt written gathered (rank 0), as save() writes it without the option.
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
  // Before the generation's group goes: drop every use of it (DDP, the GradScaler's).
  void release_group();
  // The new generation's group (the Distributed's): DDP on it without DDP's broadcast (Note [One
  // state transfer per change] in elastic_member.h), the GradScaler's inf check.
  void adopt_group();

 private:
  void set_up_amp();
  // make_optimizer with the run's config.
  std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)>
  factory() const;
  void tune_buckets(double step_seconds);  // after a step of --bucket-cap-mb auto's trials
  void wrap_model(bool init_sync);         // the wrapper on the group, with its comm hook
  // The optimizer whose learning rate and state the run sets and saves: --zero's local one.
  torch::optim::Optimizer& optimizer() { return zero_ ? zero_->local() : *optimizer_; }
  // This rank's training position and model in a Checkpoint (rank 0: the rest is the caller's);
  // --fsdp: `model`, the state gathered from the shards.
  Checkpoint checkpoint_here(CheckpointPosition at, const torch::Tensor& untrained,
                             StateDict model = {}) const;
  std::string save_sharded(CheckpointPosition at, const torch::Tensor& untrained);
  std::string save_gathered(CheckpointPosition at, const torch::Tensor& untrained);
  // Sets the state to `checkpoint` (read from `path`): the model, the training state, the step.
  // A sharded checkpoint's: `checkpoint` is rank 0's file, `shard_files` every rank's.
  void apply(const Checkpoint& checkpoint, const std::string& path,
             const std::vector<Checkpoint>* shard_files = nullptr);
  // Throws InputError when the run cannot continue `checkpoint` (another optimizer, a global batch
  // the world size cannot share); on another world size, sets the batch per rank that keeps the
  // global batch; warns of changed settings.
  void check_resumable(const Checkpoint& checkpoint, const std::string& path);
  // The optimizer state (this rank's --zero shard, or the whole), the GradScaler's and this
  // rank's RNG stream (rank 0's for a rank the checkpoint did not have).
  void load_training_state(const Checkpoint& checkpoint, const std::string& path);
  void load_optimizer_state(const Checkpoint& checkpoint, const std::string& path);
  void load_sync_state(const Checkpoint& c, const std::string& path);
  // The ids of the checkpoint's epoch still to train (its epoch_samples, or for an older
  // checkpoint those its world had not reached); InputError naming `path` for ids out of range.
  torch::Tensor untrained_samples_of(const Checkpoint& checkpoint, const std::string& path) const;

  const Config& config_;
  const Distributed& dist_;
  std::shared_ptr<torch::nn::Module> module_;  // the workload's
  const Workload& workload_;
  int64_t train_samples_;  // the training set's size
  Timeline* timeline_;
  DistributedDataParallel<> model_{nullptr};                 // not under --fsdp
  std::unique_ptr<ShardedModel> sharded_;                    // --fsdp
  std::unique_ptr<ShardedCheckpointWriter> sharded_writer_;  // --checkpoint-sharded
  std::unique_ptr<torch::optim::Optimizer> optimizer_;       // null with --zero
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;            // --zero
  std::unique_ptr<amp::GradScaler> scaler_;                  // --amp fp16
  std::unique_ptr<DiLoCo> diloco_;                           // --sync local-sgd or diloco
  // --bucket-cap-mb auto: the trials while they run; the size kept (bytes; 0: none yet).
  std::unique_ptr<core::BucketCapTuner> bucket_tuner_;
  int64_t tuned_bucket_cap_bytes_ = 0;
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
