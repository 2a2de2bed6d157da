#pragma once
// parallel ddp: every rank holds the whole model in DDP's wrapper, whose reducer all-reduces the
// gradients in buckets while the backward runs (ddp/core/distributed_data_parallel.h), with
// --comm-hook's hook and bucket-cap-mb auto's trials. ZeroMode and DiLoCoMode keep the wrapper and
// change the optimizer and what is reduced when. A private header of the train layer
// (parallel_mode.h).

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/bucket_tuning.h"
#include "ddp/core/distributed_data_parallel.h"
#include "parallel_mode.h"

namespace ddp::train {

class DdpMode : public ParallelMode {
 public:
  using ParallelMode::ParallelMode;

  void build(bool init_sync) override;
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  void begin_training() override;
  void zero_grad() override { model_->zero_grad(); }
  std::unique_ptr<Accumulation> accumulate(bool last) override;
  torch::Tensor forward(const torch::Tensor& input) override;
  int64_t record_reduction(Timeline* timeline, int64_t step) override;
  void after_step(int64_t step, double seconds) override;
  void begin_join() override { model_->begin_join(); }
  void finish_join() override { model_->finish_join(); }
  void before_evaluation() override { model_->pre_forward(); }  // rank 0's buffers

  std::string save(Checkpoint c, CheckpointPosition at) override;
  void load(const Checkpoint& c, const std::string& path,
            const std::vector<Checkpoint>* shard_files) override;
  void fill_heal(Checkpoint& c) override;
  void add_to_digest(Digest& d) override;
  // The old generation's group goes with the wrapper (whose reducer holds it and whose hooks it
  // removes); the model, the optimizer and the data stay.
  void release_group() override { model_ = nullptr; }
  // The new generation's group: the wrapper on it without DDP's broadcast (Note [One state
  // transfer per change] in elastic_member.h: the heal's is the one).
  void adopt_group() override { wrap(/*init_sync=*/false); }

 protected:
  void clip_gradients(double max_norm) override;
  // The wrapper on the group, with its comm hook (a collective unless `init_sync` is false).
  void wrap(bool init_sync);
  // Into `c` (rank 0's is written): the optimizer's state. Every rank calls it.
  virtual void fill_optimizer(Checkpoint& c);
  virtual void load_optimizer_state(const Checkpoint& c, const std::string& path);
  // This rank's optimizer state from `c` whole (`zero`: its own shard of a ZeRO checkpoint), and
  // the element-wise tensors a sharded run keeps apart.
  void load_whole_optimizer(const Checkpoint& c, const std::string& path, bool zero);

  DistributedDataParallel<> model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // null under zero

 private:
  void start_bucket_tuning();
  void tune_buckets(double step_seconds, int64_t step);  // after a step of the trials

  // bucket-cap-mb auto: the trials while they run; the size kept (bytes; 0: none yet).
  std::unique_ptr<core::BucketCapTuner> bucket_tuner_;
  int64_t tuned_bucket_cap_bytes_ = 0;
};

}  // namespace ddp::train
