// FsdpMode's option rules (declared in fsdp_mode.h): no more than the Config, in a file of their
// own so that validate() runs them where the mode itself is not linked (the config's fuzzer).
#include "fsdp_mode.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "ddp/common/error.h"

namespace ddp::train {
namespace {

// The FSDP keys without a sharded mode.
void check_fsdp_keys_need_it(const Config& config) {
  if (fsdp_mixed_precision(config))
    throw InputError("keys 'fsdp-param-dtype' and 'fsdp-reduce-dtype' need fsdp");
  if (config.checkpoint_sharded) throw InputError("key 'checkpoint-sharded' needs fsdp");
  if (!config.reshard_after_forward) throw InputError("key 'reshard-after-forward' needs fsdp");
}

}  // namespace

void FsdpMode::check_options(const Config& config, const ModeNaming& naming) {
  const Parallel mode = naming.mode;
  if (!config.checkpoint_async && !config.checkpoint_sharded) {
    throw InputError(
        "key 'checkpoint-async' false needs checkpoint-sharded (a gathered checkpoint is written "
        "before training goes on)");
  }
  if (!sharded(mode)) return check_fsdp_keys_need_it(config);
  const DistributedDataParallelOptions defaults;
  const std::vector<std::pair<bool, const char*>> refused = {
      {config.uneven, "uneven (a rank out of batches would leave the others' gathers alone)"},
      {config.elastic, "elastic"},
      {config.comm_hook != CommHook::kAllReduce, "comm-hook (FSDP reduce-scatters gradients)"},
      {config.amp != Amp::kOff && fsdp_mixed_precision(config),
       "amp together with fsdp-param-dtype or fsdp-reduce-dtype (autocast or the policy: one)"},
      {config.sync_bn, "sync-bn"},
      {mode == Parallel::kFsdp && config.hierarchical == "true",
       "hierarchical true (its gathers and reduce-scatters are over every rank; parallel hsdp "
       "shards within each host and all-reduces across hosts)"},
      {mode == Parallel::kHsdp && config.checkpoint_sharded,
       "checkpoint-sharded (not built for replicas: each host's ranks would write the same "
       "files)"},
      {config.check_params_every > 0, "check-params-every (no rank holds the whole model)"},
      {config.bucket_cap_auto, "bucket-cap-mb auto (FSDP has no buckets)"},
      {config.ddp.find_unused_parameters(), "find-unused-parameters"},
      {config.ddp.gradient_as_bucket_view(), "gradient-as-bucket-view (FSDP has no buckets)"},
      {config.ddp.bucket_cap_mb() != defaults.bucket_cap_mb() ||
           config.ddp.first_bucket_mb() != defaults.first_bucket_mb(),
       "bucket-cap-mb or first-bucket-mb (FSDP has no buckets: it gathers and reduces by layer)"},
  };
  for (const auto& [set, key] : refused) {
    if (set) throw InputError(naming.refuses(key));
  }
}

}  // namespace ddp::train
