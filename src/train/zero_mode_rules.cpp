// ZeroMode's option rules (declared in zero_mode.h): no more than the Config, in a file of their
// own so that validate() runs them where the mode itself is not linked (the config's fuzzer).
#include "zero_mode.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::train {

void ZeroMode::check_options(const Config& config, const ModeNaming& naming) {
  const Parallel mode = naming.mode;
  if (mode != Parallel::kZero) return;
  if (config.amp == Amp::kFp16) {
    throw InputError(
        "key 'amp': fp16 (with its GradScaler) cannot be combined with zero; bf16 can");
  }
  if (config.elastic) {
    throw InputError(
        "key 'elastic': cannot be combined with zero (a lost rank's optimizer shard would be "
        "lost)");
  }
}

}  // namespace ddp::train
