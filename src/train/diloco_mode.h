#pragma once
// parallel diloco (or --sync diloco): DDP's wrapper, but every backward under no_sync, so
// that each rank trains its own copy; every sync-every steps, and at each epoch's end, the models
// meet (core/diloco.h: local SGD's average, or DiLoCo's outer Nesterov step on the averaged
// change). A checkpoint, written after the epoch's synchronization, holds the common model, every
// rank's inner optimizer and the outer momentum. LocalSgdMode (local_sgd_mode.h) is the same with
// a plain average. A private header of the train layer (parallel_mode.h).

#include <memory>
#include <string>

#include "ddp/core/diloco.h"
#include "ddp_mode.h"

namespace ddp::train {

class DiLoCoMode : public DdpMode {
 public:
  using DdpMode::DdpMode;
  // What needs the ranks' models equal after every step, or a step's state on every rank, is
  // refused; sync-delay and outer-momentum are checked for every mode.
  // (diloco_mode_rules.cpp)
  static void check_options(const Config& config, const ModeNaming& naming);

  void build(bool init_sync) override;
  // Every micro-batch's gradients stay on this rank: nothing is reduced.
  std::unique_ptr<Accumulation> accumulate(bool /*last*/) override {
    return DdpMode::accumulate(false);
  }
  int64_t record_reduction(Timeline*, int64_t) override { return 0; }
  // Every sync-every steps, the models meet (a collective).
  void after_step(int64_t step, double seconds) override;
  // The pending synchronization: the epoch's evaluation, checkpoint and model.pt see the global
  // model.
  void end_epoch(int64_t epoch) override;

 protected:
  // The outer step: DiLoCo's Nesterov SGD with outer-lr and outer-momentum.
  virtual DiLoCoOptions options() const;
  void fill_optimizer(Checkpoint& c) override;
  void load_optimizer_state(const Checkpoint& c, const std::string& path) override;

 private:
  std::unique_ptr<DiLoCo> diloco_;
};

}  // namespace ddp::train
