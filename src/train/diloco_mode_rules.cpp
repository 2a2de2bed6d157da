// DiLoCoMode's option rules (declared in diloco_mode.h): no more than the Config, in a file of
// their own so that validate() runs them where the mode itself is not linked (the config's fuzzer).
#include "diloco_mode.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::train {

void DiLoCoMode::check_options(const Config& config, const ModeNaming& naming) {
  const Parallel mode = naming.mode;
  const bool local = mode == Parallel::kLocalSgd || mode == Parallel::kDiloco;
  if (local) {
    const char* refused = config.elastic                             ? "elastic"
                          : config.uneven                            ? "uneven"
                          : config.check_params_every                ? "check-params-every"
                          : config.checkpoint_on_signal              ? "checkpoint-on-signal"
                          : config.comm_hook != CommHook::kAllReduce ? "comm-hook"
                                                                     : nullptr;
    if (refused != nullptr) throw InputError(naming.refuses(refused));
    if (config.bucket_cap_auto) {
      throw InputError(
          fmt::format("key 'bucket-cap-mb': auto cannot be combined with {} (no all-reduce per "
                      "step to tune)",
                      naming.option()));
    }
  }
  if (config.sync_delay > 0 && !local) {
    throw InputError("key 'sync-delay': needs sync local-sgd or diloco");
  }
  if (config.sync_delay >= config.sync_every) {
    throw InputError(fmt::format("key 'sync-delay': {} is not below sync-every ({})",
                                 config.sync_delay, config.sync_every));
  }
  if (config.outer_momentum >= 1.0) {
    throw InputError(fmt::format("key 'outer-momentum': {} is not below 1", config.outer_momentum));
  }
}

}  // namespace ddp::train
