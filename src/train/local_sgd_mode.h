#pragma once
// parallel local-sgd (or --sync local-sgd): DiLoCoMode whose synchronization is local SGD's plain
// average of the ranks' models (an outer step of lr 1 without momentum). Its option rules are
// DiLoCoMode's, which name it. A private header of the train layer (parallel_mode.h).

#include "diloco_mode.h"

namespace ddp::train {

class LocalSgdMode : public DiLoCoMode {
 public:
  using DiLoCoMode::DiLoCoMode;

 protected:
  DiLoCoOptions options() const override {
    return DiLoCoOptions::local_sgd(run_.config.sync_every, run_.config.sync_delay);
  }
};

}  // namespace ddp::train
