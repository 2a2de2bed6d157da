#pragma once
// parallel fsdp (or --fsdp): the workload's model fully sharded by its units
// (ddp/core/fully_shard.h: each rank holds 1/N of every unit's parameters, gradients and optimizer
// state; a unit is gathered whole only while its forward or backward runs), its optimizer over this
// rank's shards, and what a replicated model gives by itself: gradient clipping by the norm over
// every rank's shards, and its state in a checkpoint's forms (ShardedState,
// ddp/train/sharded_checkpoint.h: the optimizer's state in the per-parameter form a DDP run saves,
// so that a gathered checkpoint is the same file either way and resumes on any number of ranks,
// sharded or not; or each rank's own file, --checkpoint-sharded). HsdpMode (hsdp_mode.h) shards
// within each host instead. A private header of the train layer (parallel_mode.h).

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/fully_shard.h"
#include "ddp/train/sharded_checkpoint.h"
#include "parallel_mode.h"
#include "sharded_checkpoint_writer.h"

namespace ddp::train {

class FsdpMode : public ParallelMode {
 public:
  using ParallelMode::ParallelMode;
  ~FsdpMode() override;
  // The keys that act on DDP's wrapper or on the whole model every rank holds are refused; the
  // FSDP keys need it.
  // (fsdp_mode_rules.cpp)
  static void check_options(const Config& config, const ModeNaming& naming);

  void build(bool init_sync) override;
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  void zero_grad() override { optimizer_->zero_grad(); }  // the shards' gradients
  // The micro-batches' gradients are kept whole and added up until the last one's backward
  // (FSDP2's set_requires_gradient_sync), which alone reduce-scatters.
  std::unique_ptr<Accumulation> accumulate(bool last) override;
  // The units gathered around their calls (then a collective: every rank runs as many forwards;
  // the output in float32 whatever fsdp-param-dtype), after broadcast-buffers' broadcast of rank
  // 0's buffers in training, as DDP's forward does.
  torch::Tensor forward(const torch::Tensor& input) override;
  void backward(const torch::Tensor& loss) override { model_->backward(loss); }
  // On unit u's lane (kBucketLane + u): its all-gathers (from their issue to the wait for them),
  // its forward and backward, and its reduce-scatter.
  int64_t record_reduction(Timeline* timeline, int64_t step) override;
  void before_evaluation() override;
  torch::Tensor evaluation_forward(const torch::Tensor& input) override { return forward(input); }
  // Every rank runs as many evaluation forwards (gathers) as the rank with the most.
  int64_t evaluation_forwards(int64_t batches) override;

  // The checkpoint a DDP run writes, streamed by rank 0 while the units are gathered one at a time;
  // or with --checkpoint-sharded each rank's file of <dir>/checkpoint-epoch-N.shards/ (written in
  // the background with --checkpoint-async: sharded_checkpoint_writer.h).
  std::string save(Checkpoint c, CheckpointPosition at) override;
  // --checkpoint-sharded's last write settled, and model.pt written gathered (rank 0).
  void finish_saving() override;
  void load(const Checkpoint& c, const std::string& path,
            const std::vector<Checkpoint>* shard_files) override;

 protected:
  // Scaled so that their 2-norm over every rank's shards is at most `max_norm` (a collective).
  void clip_gradients(double max_norm) override { model_->clip_grad_norm(max_norm); }
  // The group that shards and the one that replicates (null: none): every rank, and none.
  using Groups =
      std::pair<std::shared_ptr<comm::ProcessGroup>, std::shared_ptr<comm::ProcessGroup>>;
  virtual Groups groups() const { return {run_.dist.group, nullptr}; }

 private:
  std::string save_gathered(Checkpoint c, CheckpointPosition at);
  std::string save_sharded(Checkpoint c, CheckpointPosition at);
  // Rank 0's buffers (BatchNorm's statistics) to every rank (a collective).
  void broadcast_buffers();

  std::unique_ptr<FullyShardedDataParallel> model_;
  std::unique_ptr<ShardedState> state_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // over this rank's shards
  std::unique_ptr<ShardedCheckpointWriter> writer_;     // --checkpoint-sharded
};

}  // namespace ddp::train
