#pragma once
// parallel zero (or --zero): DDP's wrapper, with the optimizer state sharded over the ranks
// (ZeroRedundancyOptimizer, ZeRO stage 1: each rank steps its shard of the parameters, then
// broadcasts it). A checkpoint holds every rank's shard of the state, and resumes on another
// number of ranks resharded. A private header of the train layer (parallel_mode.h).

#include <memory>
#include <string>

#include "ddp/core/zero_redundancy_optimizer.h"
#include "ddp_mode.h"

namespace ddp::train {

class ZeroMode : public DdpMode {
 public:
  using DdpMode::DdpMode;
  // The GradScaler unscales the gradients of the optimizer it steps, and ZeRO's steps a shard;
  // a lost rank (--elastic) would take its shard of the state with it.
  // (zero_mode_rules.cpp)
  static void check_options(const Config& config, const ModeNaming& naming);

  void build(bool init_sync) override;
  torch::optim::Optimizer& optimizer() override { return zero_->local(); }

 protected:
  void step_optimizer() override { zero_->step(); }  // this rank's shard, then broadcast
  void fill_optimizer(Checkpoint& c) override;
  void load_optimizer_state(const Checkpoint& c, const std::string& path) override;

 private:
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;
};

}  // namespace ddp::train
