#pragma once
// The training loop. Reads top to bottom: next batch, forward, loss, backward (buckets are
// all-reduced while it runs), step, then the periodic blocks (log and metrics on rank 0,
// evaluation on every rank). What it trains is a TrainState (train_state.h: what a checkpoint
// holds); where the steps' time goes, a StepTimer (step_timer.h); the group's watchdog and
// --elastic's membership, an ElasticMember (elastic_member.h).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/data/loader.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/elastic_member.h"
#include "ddp/train/metrics.h"
#include "ddp/train/progress.h"
#include "ddp/train/step_timer.h"
#include "ddp/train/timeline.h"
#include "ddp/train/train_state.h"
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

struct EpochPass;  // one epoch's loader, counts and progress (src/train/epoch_pass.h)

class Trainer {
 public:
  // Validates the config, joins the process group of this launch (init_distributed), starts its
  // watchdog, sets threads, builds the workload on this rank's device, creates the output
  // directory; a restarted launch (restart count > 0) resumes from its newest checkpoint (an
  // elastic worker that joins a running group takes the group's state as run() begins instead).
  // Throws InputError on bad input.
  explicit Trainer(Config config);
  // The same on a process group the caller made (`dist.group` set: e.g. one that wraps
  // init_distributed's, or `dist.agent` set: an elastic joiner's, which joins once its model is
  // built); without either, as above. Under --elastic, move `dist` in and keep no other
  // reference to its group: when a member is lost, the survivors replace the group, and the
  // closing of its connections is how a survivor still waiting in a collective with live peers
  // only (not the lost one's neighbour in gloo's ring) learns that the step is over.
  // `preloaded`: the workload make_workload(config) returned before, used instead of making one
  // (a warm spare's, made before it forked this worker: Note [A replacement forked from a warm
  // spare] in ddp/common/fork_server.h).
  Trainer(Config config, Distributed dist, std::optional<Workload> preloaded = std::nullopt);
  ~Trainer();

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
  // The next step's micro-batches (--grad-accum-steps of them, fewer at the epoch's end), passing
  // over those a resumed epoch had trained, under the phase "step N: data" (timed); nullopt at
  // the epoch's end.
  std::optional<std::vector<data::Batch>> step_batches(EpochPass& pass);
  // Forward and backward of a step's micro-batches (one without --grad-accum-steps): the last
  // backward reduces the sum of their gradients as the mode does (DDP: each bucket all-reduced as
  // it is ready; the reduction onto the timeline, and its bytes into `pass`). Returns
  // the step's loss times the sizes (float64, not synchronised) and its samples.
  std::pair<torch::Tensor, int64_t> step_gradients(EpochPass& pass,
                                                   const std::vector<data::Batch>& batches);
  // Forward, loss and backward of one micro-batch of a step of `step_samples` samples, its loss
  // weighted by its share of them; reduced where the mode reduces the step's `last` (the others
  // under its accumulation: DDP's no_sync). Returns the micro-batch's loss times its size
  // (float64, not synchronised).
  torch::Tensor forward_backward(EpochPass& pass, const data::Batch& batch, int64_t step_samples,
                                 bool last);
  // The periodic blocks after a counted step: --check-params-every, the step times' exchange,
  // --checkpoint-on-signal (true when a SIGTERM stopped the run there, after a checkpoint).
  bool after_step(const EpochPass& pass);
  // --checkpoint-on-signal after a step: checkpoints and returns true when any rank got a
  // SIGTERM (a collective), except after the epoch's last step (train() checks after the epoch).
  bool stop_after_step(const EpochPass& pass);
  // The epoch's global loss and throughput (all-reduced) into `metrics`.
  void end_epoch(EpochPass& pass, EpochMetrics& metrics);
  // The evaluation after an epoch (all ranks): the validation split when there is one, the test
  // split after the last epoch or when there is no validation split.
  void evaluate_epoch(EpochMetrics& metrics, bool last);
  // Rank 0: the epoch's line of metrics.jsonl (a new rank 0 after an elastic change goes on with
  // the file).
  void write_metrics(const EpochMetrics& metrics);
  // The state saved (all ranks, rank 0 writes), and the launcher told (--elastic).
  void save(CheckpointPosition at, const torch::Tensor& untrained = {});
  // --checkpoint-on-signal after epoch `epoch` (1-based): when any rank got a SIGTERM (a
  // collective), checkpoints unless `saved` already did, and returns true.
  bool stop_after_epoch(int64_t epoch, bool saved);
  // --checkpoint-on-signal: whether a SIGTERM reached any rank (a collective, so that all ranks
  // stop after the same step). False without the option, and then no collective.
  bool stop_requested();

  Config config_;
  Distributed dist_;
  std::unique_ptr<Timeline> timeline_;  // --timeline; nullptr without
  StepTimer timer_;                     // where the steps' time goes, and who is slow
  Workload workload_;
  std::unique_ptr<TrainState> state_;       // what a checkpoint holds, on workload_'s model
  std::unique_ptr<ElasticMember> elastic_;  // the group's watchdog; under --elastic, the membership
  ProgressStyle progress_style_ = ProgressStyle::kOff;
  std::optional<MetricsWriter> metrics_file_;  // rank 0
};

}  // namespace ddp::train
