#pragma once
// The training loop. Reads top to bottom: next batch, forward, loss, backward (buckets are
// all-reduced while it runs), step, then the periodic blocks (log and metrics on rank 0,
// evaluation on every rank).

#include <torch/optim/optimizer.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/diagnostics/watchdog.h"
#include "ddp/core/bucket_tuning.h"
#include "ddp/core/diloco.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/grad_scaler.h"
#include "ddp/core/zero_redundancy_optimizer.h"
#include "ddp/data/loader.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/elastic_member.h"
#include "ddp/train/lr_schedule.h"
#include "ddp/train/metrics.h"
#include "ddp/train/progress.h"
#include "ddp/train/step_timer.h"
#include "ddp/train/timeline.h"
#include "ddp/train/workload.h"

namespace ddp::train {

struct TrainResult {
  std::vector<EpochMetrics> epochs;
  std::string metrics_path;
  bool stopped_by_signal = false;  // --checkpoint-on-signal: a SIGTERM ended the run early
};

// --checkpoint-on-signal's SIGTERM handler calls this (async-signal-safe: it sets a flag); every
// trainer then stops after the step that all ranks agree on.
void request_stop_from_signal();
// Exit status of a run stopped that way: 128 + SIGTERM, as if the signal had ended it.
constexpr int kExitStoppedBySignal = 143;

// The optimizer named by config.optimizer over `params`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        const std::vector<torch::Tensor>& params);

// Private ElasticTrainee: what --elastic's member (elastic_member.h) needs of the training.
class Trainer : private ElasticTrainee {
 public:
  // Validates the config, joins the process group of this launch (init_distributed), starts its
  // watchdog, sets threads, builds the workload on this rank's device, creates the output
  // directory; a restarted launch (restart count > 0) resumes from its newest checkpoint (an
  // elastic worker that joins a running group takes the group's state as run() begins instead).
  // Throws InputError on bad input.
  explicit Trainer(Config config);
  // The same on a process group the caller made (`dist.group` set: e.g. one that wraps
  // init_distributed's); without one, as above. Under --elastic, move `dist` in and keep no other
  // reference to its group: when a member is lost, the survivors replace the group, and the
  // closing of its connections is how a survivor still waiting in a collective with live peers
  // only (not the lost one's neighbour in gloo's ring) learns that the step is over.
  Trainer(Config config, Distributed dist);
  ~Trainer() override;

  // Trains up to config.epochs epochs (from where a resumed checkpoint stopped), writing metrics
  // after each and checkpoints every save_every epochs and after the last, then the timeline
  // (--timeline, a collective); returns the metrics of the epochs it trained. When a collective
  // fails or times out, writes this rank's flight record to <output>/debug/rank<r>.json before
  // rethrowing.
  TrainResult run();

  // Loss (and accuracy, or MAE and the naive forecast's) over the whole of `set`, in eval mode
  // without gradients: each rank evaluates its unpadded shard, the sums are all-reduced (every
  // sample counted once). A collective.
  Scores evaluate(const data::TensorDataset& set);
  Scores evaluate() { return evaluate(workload_.test_set); }

  // The model without the DDP wrapper.
  torch::nn::Module& module() { return *workload_.module; }
  const Distributed& distributed() const { return dist_; }
  const Config& config() const { return config_; }

 private:
  struct EpochPass;  // one epoch's loader, counts and progress (trainer.cpp)

  // The workload on this rank's device, its DDP wrapper (a collective, unless `init_sync` is
  // false) and the optimizer.
  void build_model(bool init_sync);
  // The wrapper on the group, with its comm hook.
  void wrap_model(bool init_sync);
  // --resume (or a restart's auto): loads the checkpoint; false when there is none to load.
  bool resume_if_asked();
  // --amp: checks that LibTorch runs autocast in that dtype on this device; fp16's GradScaler.
  void set_up_amp();
  // Rank 0: config.yaml, and after a resume the metrics of the epochs up to the checkpoint.
  void write_run_files(bool resumed) const;

  TrainResult train();  // run() without the flight record
  // After an epoch's steps: evaluation, the metrics (rank 0), the checkpoint, the signal check;
  // returns true when a SIGTERM stops the run there (--checkpoint-on-signal).
  bool end_of_epoch(EpochMetrics& metrics, TrainResult& result);
  // One pass over this epoch's indices; fills the training fields of `metrics`. Returns false
  // when a SIGTERM stopped it (after a checkpoint: --checkpoint-on-signal).
  bool train_epoch(int64_t epoch, EpochMetrics& metrics);
  bool train_steps(EpochPass& pass, EpochMetrics& metrics);  // its steps, then end_epoch()
  EpochPass begin_epoch(int64_t epoch);
  // The sampler's sequence of `epoch` for `world` ranks (every rank's indices, interleaved).
  torch::Tensor epoch_sequence(int64_t epoch, int64_t world) const;
  // The ids of `pass` that no rank has trained yet (a mid-epoch checkpoint's epoch_samples).
  torch::Tensor untrained_samples(const EpochPass& pass) const;
  int64_t steps_for(int64_t samples) const;  // optimizer steps over `samples` of one rank
  // The next step's micro-batches (--grad-accum-steps of them, fewer at the epoch's end), passing
  // over those a resumed epoch had trained, under the phase "step N: data" (timed); nullopt at
  // the epoch's end.
  std::optional<std::vector<data::Batch>> step_batches(EpochPass& pass);
  std::optional<data::Batch> next_batch(EpochPass& pass);  // one of them
  // Forward and backward of a step's micro-batches (one without --grad-accum-steps): the last
  // backward reduces the sum of their gradients, each bucket all-reduced as it is ready. Returns
  // the step's loss times the sizes (float64, not synchronised) and its samples.
  std::pair<torch::Tensor, int64_t> step_gradients(EpochPass& pass,
                                                   const std::vector<data::Batch>& batches);
  // The optimizer step on the reduced gradients: --amp fp16's unscale and inf check (the step is
  // then skipped on every rank), --clip-grad-norm, then the step (--zero: this rank's shard,
  // broadcast to the others).
  void optimizer_step();
  // Forward, loss and backward of one micro-batch of a step of `step_samples` samples, its loss
  // weighted by its share of them; reduced only when `sync` (else under no_sync). Returns the
  // micro-batch's loss times its size (float64, not synchronised).
  torch::Tensor forward_backward(EpochPass& pass, const data::Batch& batch, int64_t step_samples,
                                 bool sync);
  // --checkpoint-on-signal after a step: checkpoints and returns true when any rank got a
  // SIGTERM (a collective), except after the epoch's last step (train() checks after the epoch).
  bool stop_after_step(const EpochPass& pass);
  // The epoch's global loss and throughput (all-reduced) into `metrics`.
  void end_epoch(EpochPass& pass, EpochMetrics& metrics);
  // The evaluation after an epoch (all ranks): the validation split when there is one, the test
  // split after the last epoch or when there is no validation split.
  void evaluate_epoch(EpochMetrics& metrics, bool last);
  // The checkpoint after epoch `epoch` (1-based; all ranks, rank 0 writes).
  void checkpoint_epoch(int64_t epoch);
  // --checkpoint-on-signal after epoch `epoch` (1-based): when any rank got a SIGTERM (a
  // collective), checkpoints unless `saved` already did, and returns true.
  bool stop_after_epoch(int64_t epoch, bool saved);
  // --checkpoint-on-signal: whether a SIGTERM reached any rank (a collective, so that all ranks
  // stop after the same step). False without the option, and then no collective.
  bool stop_requested();
  // The DataParallel tutorial's printout, for the run's first step: the part of the global
  // batch each rank saw ("rank 1: input [15, 5] -> output [15, 2]"). A collective.
  void log_shapes(const torch::Tensor& input, const torch::Tensor& output);
  // --check-params-every: compares checksums of the parameters across ranks (a collective);
  // throws Error naming the first parameter that differs and the ranks where it does.
  void check_parameters();
  // --record-samples: every rank's sample ids of the step in flight (a collective), and the
  // counted step's line of samples.jsonl (rank 0 writes it); returns the line.
  std::vector<std::string> gather_sample_ids(const EpochPass& pass);
  std::string record_samples(const EpochPass& pass, const std::vector<std::string>& all);
  // The position of `pass` (its counted steps), where the next generation goes on (--elastic).
  ElasticPosition position_of(const EpochPass& pass) const;
  // ElasticTrainee (elastic_member.h).
  void release_group() override;
  void adopt_group() override;
  Checkpoint state_at(const ElasticPosition& at, int world) override;
  void take_state(const Checkpoint& state, const std::string& origin) override;
  ElasticPosition state_position() const override;
  uint64_t state_digest() override;
  int64_t steps() const override { return step_; }
  int64_t batch_size() const override { return batch_size_; }

  // How the training batches of `epoch` are prepared (--workers, --pin-memory, --augment), in a
  // pass that starts after `first_step` of its steps.
  data::LoaderOptions loader_options(int64_t epoch, int64_t first_step) const;

  // Checkpoints (trainer_checkpoint.cpp). Both are called on every rank: see
  // Note [No collective in a rank-0 branch].
  // Writes checkpoint-epoch-N[-step-S].pt, checkpoint.pt and model.pt (rank 0), then a barrier.
  // In the middle of an epoch, `untrained` holds its ids not yet trained.
  void save_checkpoint(CheckpointPosition at, const torch::Tensor& untrained = {});
  // This rank's training position and model in a Checkpoint (rank 0: the rest is the caller's).
  Checkpoint checkpoint_here(CheckpointPosition at, const torch::Tensor& untrained) const;
  // Loads the checkpoint config.resume names; returns false when `auto` finds none.
  bool resume();
  // Sets the run to `checkpoint` (read from `path`): the model, the training state, the step.
  void apply(const Checkpoint& checkpoint, const std::string& path);
  // Throws InputError when the run cannot continue `checkpoint` (another optimizer, a global batch
  // the world size cannot share); on another world size, sets the batch per rank that keeps the
  // global batch; warns of changed settings.
  void check_resumable(const Checkpoint& checkpoint, const std::string& path);
  // The optimizer state (this rank's --zero shard, or the whole), the GradScaler's and this
  // rank's RNG stream (rank 0's for a rank the checkpoint did not have).
  void load_training_state(const Checkpoint& checkpoint, const std::string& path);
  void load_sync_state(const Checkpoint& c, const std::string& path);
  // --bucket-cap-mb auto: the size a checkpoint kept, or the trials from the first step on.
  void start_bucket_tuning();
  void tune_buckets(double step_seconds);  // after each step of the trials
  // The ids of the checkpoint's epoch still to train (its epoch_samples, or for an older
  // checkpoint those its world had not reached); InputError naming `path` for ids out of range.
  torch::Tensor untrained_samples_of(const Checkpoint& checkpoint, const std::string& path) const;
  // The optimizer state this rank loads: its --zero shard, or the whole state (InputError when
  // the checkpoint and the run disagree on --zero).
  const at::Tensor& zero_state_of(const Checkpoint& checkpoint, const std::string& path) const;
  // --zero from a checkpoint of another world size: this rank's shard of the state, taken from
  // the saved shards of the ranks that owned its parameters.
  void load_resharded_zero_state(const Checkpoint& checkpoint, const std::string& path);
  // `optimizer` from its serialized `state` (InputError naming `path` when it does not fit).
  void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& state,
                      const std::string& path) const;

  Config config_;
  Distributed dist_;
  std::unique_ptr<comm::Watchdog> watchdog_;  // after dist_: stops before the group goes
  Workload workload_;
  DistributedDataParallel<> model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // null with --zero
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;       // --zero
  // The optimizer whose learning rate and state the run sets and saves: --zero's local one.
  torch::optim::Optimizer& optimizer() { return zero_ ? zero_->local() : *optimizer_; }
  std::unique_ptr<amp::GradScaler> scaler_;  // --amp fp16
  std::unique_ptr<DiLoCo> diloco_;           // --sync local-sgd or diloco
  // --bucket-cap-mb auto: the trials while they run; the size kept (bytes; 0: none yet).
  std::unique_ptr<core::BucketCapTuner> bucket_tuner_;
  int64_t tuned_bucket_cap_bytes_ = 0;
  LrSchedule schedule_;
  std::unique_ptr<Timeline> timeline_;  // --timeline; nullptr without
  StepTimer timer_;                     // where the steps' time goes, and who is slow
  ProgressStyle progress_style_ = ProgressStyle::kOff;
  int64_t step_ = 0;                   // optimizer steps taken
  int64_t start_epoch_ = 0;            // epochs done before this run (resume)
  int64_t start_epoch_step_ = 0;       // steps of epoch start_epoch_ done before it (a SIGTERM's)
  torch::Tensor start_epoch_samples_;  // and the ids of it still to train (undefined: none)
  // The batch per rank now, for batch_world_ ranks: the config's (batch-size, or global-batch-size
  // over the world), a checkpoint's for a new world, or the group's after an elastic change. The
  // config stays as the user wrote it.
  int64_t batch_size_ = 0;
  int64_t batch_world_ = 1;
  std::optional<MetricsWriter> metrics_file_;    // rank 0
  std::unique_ptr<std::ofstream> samples_file_;  // --record-samples, rank 0
  std::unique_ptr<ElasticMember> elastic_;       // does nothing without --elastic
};

}  // namespace ddp::train
