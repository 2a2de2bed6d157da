#pragma once
// How the ranks keep the model (key parallel): one class per mode, behind one interface that the
// TrainState (ddp/train/train_state.h) and the Trainer drive without knowing which mode runs. A
// private header of the train layer.
//
//   parallel          class (file)                  what each rank holds
//   ddp               DdpMode (ddp_mode.h)          the model, DDP's wrapper reducing in buckets
//   zero              ZeroMode (zero_mode.h)        the same, the optimizer state of its shard
//   fsdp              FsdpMode (fsdp_mode.h)        1/N of parameters, gradients, optimizer state
//   hsdp              HsdpMode (hsdp_mode.h)        the same, N the ranks of its host, replicated
//   diloco            DiLoCoMode (diloco_mode.h)    the model, trained alone between outer steps
//   local-sgd         LocalSgdMode (local_sgd_mode.h) the same, averaged
//
// A mode owns its wrapper and its optimizer, the training and the evaluation forward, accumulation
// without sync, clipping and the optimizer step, its part of a save, a resume and an elastic heal,
// and its option rules (check_options, in its <mode>_mode_rules.cpp, which validate() calls for
// every mode). The
// TrainState owns what every mode shares: the step, the position in the epoch, the RNG, the
// GradScaler, the schedule, the batch size, and the order of a save (train_state.h).

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/grad_scaler.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/timeline.h"
#include "ddp/train/workload.h"
#include "optimizer_state.h"

namespace ddp::train {

// What a mode works on: the run's settings, its group (which --elastic replaces), the workload's
// model and forward, the timeline (--timeline; may be null). All outlive the mode.
struct ModeContext {
  const Config& config;
  const Distributed& dist;
  const Workload& workload;
  Timeline* timeline;
};

// While one lives, a mode's backwards keep their gradients on this rank, added up, for a later
// backward to reduce (DDP's no_sync).
class Accumulation {
 public:
  virtual ~Accumulation() = default;
};

class ParallelMode {
 public:
  explicit ParallelMode(const ModeContext& run) : run_(run) {}
  virtual ~ParallelMode() = default;
  ParallelMode(const ParallelMode&) = delete;
  ParallelMode& operator=(const ParallelMode&) = delete;

  // The optimizer and the wrapper on the group: a collective unless `init_sync` is false (it
  // checks that the model is the same everywhere and gives every rank rank 0's weights).
  virtual void build(bool init_sync) = 0;
  // The optimizer whose learning rate and state the run sets (zero: this rank's shard's).
  virtual torch::optim::Optimizer& optimizer() = 0;

  // Before the run's first step (ddp: bucket-cap-mb auto's trials).
  virtual void begin_training() {}
  // The gradients dropped before a step's first backward.
  virtual void zero_grad() = 0;
  // Around one micro-batch's forward and backward (`last`: the step's last): what keeps its
  // gradients on this rank (null: its backward reduces them).
  virtual std::unique_ptr<Accumulation> accumulate(bool last) = 0;
  // The workload's forward on `input` in training, through the mode's wrapper.
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  // loss.backward() (fsdp: an error in it names the unit whose backward ran).
  virtual void backward(const torch::Tensor& loss) { loss.backward(); }
  // After the step's backwards: the reduction's spans onto `timeline` (may be null); returns the
  // bytes its collectives carried (0 where the mode does not count them).
  virtual int64_t record_reduction(Timeline* timeline, int64_t step) = 0;
  // On the reduced gradients: `scaler`'s unscale and inf check (may be null: --amp fp16's), the
  // clipping (--clip-grad-norm), then the step (skipped on every rank after an inf or NaN).
  void optimizer_step(amp::GradScaler* scaler);
  // After a counted step that took `seconds`: the mode's own work (a collective where it has one).
  virtual void after_step(int64_t /*step*/, double /*seconds*/) {}
  // After the epoch's last step, before its metrics, evaluation and checkpoint.
  virtual void end_epoch(int64_t /*epoch*/) {}
  // --uneven: a rank out of batches joins the others' steps until all are done (core/join.h).
  virtual void begin_join();
  virtual void finish_join();

  // Before an evaluation's forwards: rank 0's buffers to every rank (broadcast-buffers).
  virtual void before_evaluation() = 0;
  // An evaluation batch's forward (no gradients): the module's own by default, no collective.
  virtual torch::Tensor evaluation_forward(const torch::Tensor& input) {
    return run_.workload.forward(input);
  }
  // How many evaluation forwards this rank runs when it has `batches`: its own, or where a forward
  // is a collective, the most any rank has (a collective).
  virtual int64_t evaluation_forwards(int64_t batches) { return batches; }

  // Saves `c` (the shared part filled on every rank: the position, the RNG states, the
  // GradScaler's) with the mode's model and optimizer; every rank calls it. Returns what the log
  // and the launcher are told ("<file> (after epoch 2)").
  virtual std::string save(Checkpoint c, CheckpointPosition at) = 0;
  // After the training's last save (every rank).
  virtual void finish_saving() {}
  // The model, the optimizer and the mode's own state from `c` (read from `path`); a sharded
  // checkpoint's every rank file in `shard_files` (null: a whole checkpoint).
  virtual void load(const Checkpoint& c, const std::string& path,
                    const std::vector<Checkpoint>* shard_files) = 0;
  // --elastic (whose rules admit ddp alone): the model and optimizer into a heal's message; the
  // model, optimizer and buffers into a digest; the group given up and taken again.
  virtual void fill_heal(Checkpoint& c);
  virtual void add_to_digest(Digest& d);
  virtual void release_group() {}
  virtual void adopt_group() {}

 protected:
  // Scales the gradients so that their global 2-norm is at most `max_norm`.
  virtual void clip_gradients(double max_norm) = 0;
  virtual void step_optimizer() { optimizer().step(); }
  // make_optimizer with the run's config, for what builds optimizers over other tensors (ZeRO's
  // shards, a resharded or sharded checkpoint's).
  OptimizerFactory optimizer_factory() const;

  ModeContext run_;
};

// A run's mode as its option rules name it: by the key the user chose it with.
struct ModeNaming {
  Parallel mode;
  std::string key;    // "fsdp", "sync", "zero", "parallel"
  std::string value;  // "", "diloco", "", "fsdp"
  // "fsdp", "sync diloco"
  std::string option() const { return value.empty() ? key : key + " " + value; }
  // "key 'fsdp': cannot be combined with uneven", "key 'sync': diloco cannot be combined with zero"
  std::string refuses(const std::string& what) const {
    return "key '" + key + "': " + (value.empty() ? "" : value + " ") + "cannot be combined with " +
           what;
  }
};

}  // namespace ddp::train
