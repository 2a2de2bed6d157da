#pragma once
// The mode a run's config names (a private header of the train layer). Above parallel_mode.h and
// the modes' own headers, which know nothing of each other but their bases.

#include <memory>

#include "ddp/train/config.h"
#include "parallel_mode.h"

namespace ddp::train {

// The mode config.parallel names (resolved: parallel_mode()).
std::unique_ptr<ParallelMode> make_parallel_mode(const ModeContext& run);

}  // namespace ddp::train
