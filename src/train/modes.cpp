#include "modes.h"

#include <fmt/format.h>

#include "ddp/common/error.h"
#include "ddp_mode.h"
#include "diloco_mode.h"
#include "fsdp_mode.h"
#include "hsdp_mode.h"
#include "local_sgd_mode.h"
#include "zero_mode.h"

namespace ddp::train {

std::unique_ptr<ParallelMode> make_parallel_mode(const ModeContext& run) {
  switch (run.config.parallel) {
    case Parallel::kDdp:
      return std::make_unique<DdpMode>(run);
    case Parallel::kZero:
      return std::make_unique<ZeroMode>(run);
    case Parallel::kFsdp:
      return std::make_unique<FsdpMode>(run);
    case Parallel::kHsdp:
      return std::make_unique<HsdpMode>(run);
    case Parallel::kLocalSgd:
      return std::make_unique<LocalSgdMode>(run);
    case Parallel::kDiloco:
      return std::make_unique<DiLoCoMode>(run);
  }
  throw Error(
      fmt::format("make_parallel_mode: no case for {}", static_cast<int>(run.config.parallel)));
}

}  // namespace ddp::train
