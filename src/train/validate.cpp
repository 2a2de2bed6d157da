#include "ddp/train/config.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "diloco_mode.h"
#include "fsdp_mode.h"
#include "parallel_mode.h"
#include "zero_mode.h"

namespace ddp::train {
namespace {

// bucket-cap-mb auto: the ranks re-bucket at steps they count alike, with the plain all-reduce.
void validate_bucket_tuning(const Config& config) {
  if (!config.bucket_cap_auto) return;
  std::string refused;
  if (config.elastic) refused = "elastic (a member that joins does not know the trials)";
  if (config.uneven) refused = "uneven (a joined rank takes no steps)";
  if (config.comm_hook == CommHook::kPowerSgd) {
    refused = "comm-hook powersgd (its state is per bucket)";
  }
  if (!refused.empty()) {
    throw InputError("key 'bucket-cap-mb': auto cannot be combined with " + refused);
  }
}

// The model and the data must fit each other, and so must the keys that only some models or data
// read (the informer's sizes, augment, sync-bn).
void validate_workload(const Config& config) {
  if (config.model == "linear" && config.dataset != "random") {
    throw InputError(fmt::format("model 'linear' trains on dataset 'random' (5 features), not '{}'",
                                 config.dataset));
  }
  if ((config.model == "informer") != (config.dataset == "csv")) {
    throw InputError(
        fmt::format("model '{}' and dataset '{}': the informer trains on csv data, "
                    "and csv data trains the informer",
                    config.model, config.dataset));
  }
  const auto& series = config.time_series;
  if (series.label_len > series.seq_len) {
    throw InputError(fmt::format("key 'label-len': {} is longer than seq-len {}", series.label_len,
                                 series.seq_len));
  }
  const auto& informer = config.informer;
  if (informer.d_model % 2 != 0 || informer.d_model % informer.n_heads != 0) {
    throw InputError(fmt::format("key 'd-model': {} must be even and a multiple of n-heads {}",
                                 informer.d_model, informer.n_heads));
  }
  if (informer.dropout >= 1.0) {
    throw InputError(fmt::format("key 'dropout': {} is not below 1", informer.dropout));
  }
  if ((config.model == "mlp" || config.model == "resnet18" || config.model == "wide-mlp") &&
      config.dataset != "fashion-mnist") {
    throw InputError(fmt::format("model '{}' trains on dataset 'fashion-mnist', not '{}'",
                                 config.model, config.dataset));
  }
  if (config.augment && config.dataset != "fashion-mnist") {
    throw InputError(fmt::format("key 'augment': dataset '{}' has no images", config.dataset));
  }
  if (config.sync_bn && config.model != "resnet18") {
    throw InputError(fmt::format("key 'sync-bn': model '{}' has no BatchNorm layer", config.model));
  }
}

// --elastic: the keys whose state a lost rank would take with it or that cannot follow a new
// group, and the backends that end every rank when one is lost.
void validate_elastic(const Config& config) {
  if (!config.elastic) return;
  const char* refused = config.sync_bn  ? "sync-bn (its layers hold the group they were built on)"
                        : config.uneven ? "uneven (Join's shadow steps)"
                        : config.comm_hook == CommHook::kPowerSgd
                            ? "comm-hook powersgd (its per-rank error feedback)"
                            : nullptr;
  if (refused != nullptr) {
    throw InputError(fmt::format("key 'elastic': cannot be combined with {}", refused));
  }
  if (config.backend == "local" || config.backend == "mpi") {
    throw InputError(fmt::format(
        "key 'elastic': backend '{}' cannot survive a lost rank (Open MPI ends every rank with "
        "it); use shm or gloo (or nccl on GPUs) under launcher --nnodes MIN:MAX",
        config.backend));
  }
}

// Every key that names a mode, with the mode it names, the older ones first.
std::vector<ModeNaming> mode_claims(const Config& config) {
  std::vector<ModeNaming> claims;
  if (config.fsdp) claims.push_back({Parallel::kFsdp, "fsdp", ""});
  if (config.sync != "ddp") {
    claims.push_back(
        {config.sync == "diloco" ? Parallel::kDiloco : Parallel::kLocalSgd, "sync", config.sync});
  }
  if (config.zero) claims.push_back({Parallel::kZero, "zero", ""});
  if (config.parallel != Parallel::kDdp) {
    claims.push_back({config.parallel, "parallel", to_string(config.parallel)});
  }
  return claims;
}

// The claim the mode's rules name (the first), after refusing two that differ.
ModeNaming mode_naming(const Config& config) {
  const std::vector<ModeNaming> claims = mode_claims(config);
  if (claims.empty()) return {Parallel::kDdp, "parallel", "ddp"};
  const ModeNaming& first = claims.front();
  for (const ModeNaming& other : claims) {
    if (other.mode == first.mode) continue;
    const char* why = other.mode == Parallel::kZero && sharded(first.mode)
                          ? " (FSDP shards the optimizer state already)"
                      : sharded(first.mode) ? " (each rank would train a whole model)"
                      : other.key == "parallel"
                          ? " (each names how the ranks keep the model: write one)"
                          : "";
    throw InputError(first.refuses(other.option() + why));
  }
  return first;
}

}  // namespace

Parallel parallel_mode(const Config& config) {
  return mode_naming(config).mode;
}

void validate(const Config& config) {
  validate_workload(config);
  // Each mode's rules (in its *_mode_rules.cpp: no more than the Config, so that the config's
  // fuzzer runs them), whichever mode the run is in: a mode's keys may need it.
  const ModeNaming naming = mode_naming(config);
  ZeroMode::check_options(config, naming);
  FsdpMode::check_options(config, naming);
  DiLoCoMode::check_options(config, naming);
  validate_elastic(config);
  validate_bucket_tuning(config);
  if (config.warmup_epochs > static_cast<double>(config.epochs)) {
    throw InputError(fmt::format("key 'warmup-epochs': {} is longer than the {} epochs of the run",
                                 config.warmup_epochs, config.epochs));
  }
}

}  // namespace ddp::train
