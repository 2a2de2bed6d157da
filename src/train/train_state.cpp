#include "ddp/train/train_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "checkpoint_files.h"
#include "cpu_rng.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/core/autocast.h"
#include "ddp/data/distributed_sampler.h"
#include "optimizer_state.h"
#include "modes.h"
#include "parallel_mode.h"
#include "phase.h"
#include "torch_errors.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;

// Settings a resumed run may change without a warning: they do not change the training math.
const std::vector<std::string> kFreeOnResume = {"epochs",
                                                "resume",
                                                "output-dir",
                                                "log-level",
                                                "eval-every",
                                                "save-every",
                                                "keep-last",
                                                "save-prefix",
                                                "init-weights",
                                                "threads",
                                                "comm-timeout",
                                                "rendezvous-timeout",
                                                "backend",
                                                "device",
                                                "batch-size",
                                                "stall-warning",
                                                "check-params-every",
                                                "checkpoint-on-signal",
                                                "record-samples"};

// The ranks' RNG states (uint8, `bytes` each) as the checkpoint's [rank, byte] tensor.
at::Tensor rng_rows(const std::vector<std::string>& states, int64_t bytes) {
  auto rows = torch::empty({static_cast<int64_t>(states.size()), bytes}, torch::kByte);
  for (size_t r = 0; r < states.size(); ++r) {
    std::memcpy(rows[static_cast<int64_t>(r)].data_ptr(), states[r].data(), states[r].size());
  }
  return rows;
}

// Every rank's RNG state as the checkpoint's [rank, byte] tensor (a collective).
at::Tensor all_rng_states(const Distributed& dist) {
  const at::Tensor rng = cpu_rng_state().contiguous();
  const std::string bytes(static_cast<const char*>(rng.data_ptr()), rng.nbytes());
  return rng_rows(comm::all_gather_bytes(*dist.group, bytes, dist.device, bytes.size()),
                  rng.numel());
}

// --global-batch-size, DataParallel's habit: one batch split evenly over the ranks; else
// --batch-size.
int64_t batch_size_per_rank(const Config& config, int world_size) {
  if (config.global_batch_size == 0) return config.batch_size;
  if (config.global_batch_size % world_size != 0) {
    throw InputError(
        fmt::format("key 'global-batch-size': {} samples cannot be split evenly over {} ranks",
                    config.global_batch_size, world_size));
  }
  return config.global_batch_size / world_size;
}

// The lr schedule of the run, its base lr scaled for the global batch (--lr-scaling).
LrSchedule lr_schedule_of(const Config& config, int64_t batch_size, int world_size) {
  LrSchedule schedule;
  schedule.kind = config.lr_schedule;
  const int64_t global_batch = batch_size * world_size * config.grad_accum_steps;
  schedule.base_lr = scaled_lr(config.lr, config.lr_scaling, global_batch, config.reference_batch);
  if (config.lr_scaling == LrScaling::kLinear) {
    log::info("lr {} scaled linearly to {} for the global batch {} (reference batch {})", config.lr,
              schedule.base_lr, global_batch, config.reference_batch);
  }
  schedule.warmup_epochs = config.warmup_epochs;
  schedule.step_size = config.lr_step_size;
  schedule.gamma = config.lr_gamma;
  schedule.total_epochs = config.epochs;
  return schedule;
}

// A checkpoint file, or every rank's file of a sharded checkpoint's directory (rank 0's first).
std::vector<Checkpoint> read_checkpoints(const std::string& path) {
  if (fs::is_directory(path)) return read_sharded_checkpoint(path);
  return {read_checkpoint(path)};
}

// The checkpoint --resume names (its path into `path`), or with `auto` the newest in the output
// directory that reads as one (nullopt: none there; an incomplete sharded checkpoint does not).
// `main`: warns of those skipped.
std::optional<std::vector<Checkpoint>> find_checkpoint(const Config& config, bool main,
                                                       std::string& path) {
  if (config.resume != "auto") {
    path = config.resume;
    return read_checkpoints(path);
  }
  std::vector<std::string> candidates = list_checkpoints(config.output_dir);
  const std::string latest = (fs::path(config.output_dir) / "checkpoint.pt").string();
  if (candidates.empty() && fs::exists(latest)) candidates.push_back(latest);
  for (const auto& candidate : candidates) {
    try {
      std::vector<Checkpoint> files = read_checkpoints(candidate);
      path = candidate;
      return files;
    } catch (const InputError& e) {
      if (main) log::warn("--resume auto: skipping {}", e.what());
    }
  }
  if (!candidates.empty()) {
    throw InputError(
        fmt::format("--resume auto: none of the {} checkpoint(s) in '{}' can be "
                    "read (see the warnings above)",
                    candidates.size(), config.output_dir));
  }
  return std::nullopt;
}

// --amp's check, the same answer on every rank (so that all stop together when it is no), and
// fp16's GradScaler on the group (null without).
std::unique_ptr<amp::GradScaler> make_scaler(const Config& config, const Distributed& dist) {
  if (config.amp == Amp::kOff) return nullptr;
  const c10::DeviceType type = dist.device.type();
  const std::string unsupported = amp::autocast_unsupported(type, autocast_dtype(config.amp));
  if (!unsupported.empty()) {
    throw InputError(
        fmt::format("key 'amp': LibTorch {} cannot run {} autocast on {} ({}){}", TORCH_VERSION,
                    to_string(config.amp), c10::DeviceTypeName(type, true), unsupported,
                    config.amp == Amp::kFp16 && type == c10::kCPU ? "; bf16 can" : ""));
  }
  std::unique_ptr<amp::GradScaler> scaler;
  if (config.amp == Amp::kFp16) scaler = std::make_unique<amp::GradScaler>(dist.group);
  log::info(
      "mixed precision: {} autocast on {}{}", to_string(config.amp),
      c10::DeviceTypeName(type, true),
      scaler ? fmt::format(", the loss scaled by a GradScaler from {}", scaler->get_scale()) : "");
  return scaler;
}

// The batch per rank that continues `c` on this world (its own on the same world). InputError when
// the run cannot continue it (another optimizer, a global batch the world size cannot share);
// rank 0 warns of a new batch per rank and of changed settings.
int64_t resumable_batch_size(const Checkpoint& c, const std::string& path, const Config& config,
                             const Distributed& dist, int64_t batch_size) {
  if (c.batch_size == 0) {
    throw InputError(fmt::format(
        "{}: a checkpoint of a model and its optimizer alone (ddp::train::ShardedCheckpoint), "
        "with no training position to resume from",
        path));
  }
  if (c.optimizer != to_string(config.optimizer)) {
    throw InputError(fmt::format("{}: saved with optimizer '{}', but the run uses '{}'", path,
                                 c.optimizer, to_string(config.optimizer)));
  }
  const int64_t world = dist.world_size();
  if (c.world_size != world) {
    const auto batch = batch_size_for_world(c.batch_size, c.world_size, world);
    if (!batch) {
      throw InputError(fmt::format(
          "{}: saved by {} ranks with batch size {} (global batch {}), which {} ranks cannot "
          "share evenly; resume on a world size that divides {}",
          path, c.world_size, c.batch_size, c.batch_size * c.world_size, world,
          c.batch_size * c.world_size));
    }
    if (dist.is_main()) {
      log::warn(
          "{}: saved by {} ranks, resumed on {}: batch size per rank {} -> {} keeps the "
          "global batch {}",
          path, c.world_size, world, c.batch_size, *batch, c.batch_size * c.world_size);
    }
    batch_size = *batch;
  }
  if (dist.is_main()) {
    // A checkpoint older than the key parallel names its mode by the older keys alone.
    std::vector<std::string> free = kFreeOnResume;
    if (c.config.find("\nparallel:") == std::string::npos) free.push_back("parallel");
    for (const auto& change : changed_settings(c.config, to_yaml(config), free)) {
      log::warn("{}: resuming with a changed setting, {}", path, change);
    }
  }
  return batch_size;
}

// The ids of the checkpoint's epoch still to train (its epoch_samples, or for an older
// checkpoint those its world had not reached); InputError naming `path` for ids out of range.
torch::Tensor untrained_samples_of(const Checkpoint& c, const std::string& path,
                                   const Config& config, const Distributed& dist,
                                   int64_t train_samples) {
  if (!c.epoch_samples.defined()) {
    // Written before checkpoints held the ids: its world took the sampler's sequence in strides.
    const torch::Tensor sequence = epoch_sequence(config, train_samples, c.epoch, c.world_size);
    const int64_t trained = data::trained_prefix(
        sequence.size(0), c.world_size, c.epoch_step * c.batch_size * config.grad_accum_steps);
    return sequence.narrow(0, trained, sequence.size(0) - trained);
  }
  const torch::Tensor& ids = c.epoch_samples;
  if (ids.numel() > 0 &&
      (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= train_samples)) {
    throw InputError(fmt::format(
        "{}: 'epoch_samples' holds sample ids from {} to {}, outside the {} training samples of "
        "this run's data",
        path, ids.min().item<int64_t>(), ids.max().item<int64_t>(), train_samples));
  }
  if (c.world_size != dist.world_size() && dist.is_main()) {
    log::info("{}: epoch {}'s {} untrained samples are shared by {} ranks, not {}", path,
              c.epoch + 1, ids.numel(), dist.world_size(), c.world_size);
  }
  return ids;
}

// The GradScaler's state (`scaler` may be null) and this rank's RNG stream from `c` (rank 0's for
// a rank the checkpoint did not have).
void load_shared_state(const Checkpoint& c, const std::string& path, amp::GradScaler* scaler,
                       const Distributed& dist) {
  if (scaler != nullptr && c.grad_scaler) {
    scaler->load_state(*c.grad_scaler);
  } else if (scaler != nullptr && dist.is_main()) {
    log::warn("{}: saved without --amp fp16: the GradScaler starts from scale {}", path,
              scaler->get_scale());
  }
  const int64_t row = dist.rank() < c.world_size ? dist.rank() : 0;
  try {
    set_cpu_rng_state(c.rng_state[row].contiguous());
  } catch (const c10::Error& e) {
    throw InputError(
        fmt::format("{}: the RNG state cannot be restored: {}", path, first_line_of(e)));
  }
}

// What every mode's checkpoint holds: where the training stands, and with what settings.
Checkpoint checkpoint_at(CheckpointPosition at, const torch::Tensor& untrained, int64_t step,
                         int64_t batch_size, const Config& config, const Distributed& dist) {
  Checkpoint c;
  c.epoch = at.epoch;
  c.epoch_step = at.epoch_step;
  c.epoch_samples = untrained;
  c.step = step;
  c.world_size = dist.world_size();
  c.batch_size = batch_size;
  c.seed = config.seed;
  c.optimizer = to_string(config.optimizer);
  c.config = to_yaml(config);
  return c;
}

}  // namespace

torch::Tensor EpochPosition::rest() const {
  if (!sequence.defined()) return torch::empty({0}, torch::kLong);
  return sequence.narrow(0, trained, sequence.size(0) - trained).clone();
}

torch::Tensor epoch_sequence(const Config& config, int64_t samples, int64_t epoch, int64_t world) {
  data::DistributedSampler sampler(samples, world, /*rank=*/0,
                                   /*shuffle=*/true, static_cast<uint64_t>(config.seed));
  sampler.set_epoch(epoch);  // here, so nobody can forget it
  return sampler.sequence(config.uneven);
}

TrainState::TrainState(const Config& config, const Distributed& dist, const Workload& workload,
                       Timeline* timeline)
    : config_(config),
      dist_(dist),
      workload_(workload),
      timeline_(timeline),
      mode_(make_parallel_mode({config, dist, workload, timeline})),
      batch_size_(batch_size_per_rank(config, dist.world_size())),
      batch_world_(dist.world_size()) {}

TrainState::~TrainState() = default;

void TrainState::build(bool init_sync) {
  scaler_ = make_scaler(config_, dist_);
  mode_->build(init_sync);
}

void TrainState::set_schedule() {
  schedule_ = lr_schedule_of(config_, batch_size_, dist_.world_size());
}

EpochPosition TrainState::position() const {
  return {start_epoch_, start_epoch_step_, start_epoch_step_, start_epoch_samples_, 0};
}

void TrainState::count_step(double step_seconds) {
  ++step_;
  mode_->after_step(step_, step_seconds);
}

void TrainState::set_lr(double lr) {
  for (auto& group : mode_->optimizer().param_groups()) group.options().set_lr(lr);
}

void TrainState::optimizer_step() {
  // Its collectives (the GradScaler's inf check, ZeRO's broadcasts) under a label of their own.
  const Phase phase(*dist_.group, fmt::format("step {}: optimizer", step_ + 1), timeline_,
                    "optimizer step", "compute", step_ + 1);
  mode_->optimizer_step(scaler_.get());
}

uint64_t TrainState::digest() {
  Digest d;
  mode_->add_to_digest(d);
  if (scaler_) {
    const amp::GradScalerState& s = scaler_->state();
    d.add_value(s.scale);
    d.add_value(s.growth_tracker);
  }
  d.add(cpu_rng_state());
  d.add_value(step_);
  return d.value();
}

std::string TrainState::save(CheckpointPosition at, const torch::Tensor& untrained) {
  Checkpoint c = checkpoint_at(at, untrained, step_, batch_size_, config_, dist_);
  c.rng_state = all_rng_states(dist_);  // a collective, so all ranks are here
  if (scaler_) c.grad_scaler = scaler_->state();
  return mode_->save(std::move(c), at);
}

void TrainState::finish_saving() {
  mode_->finish_saving();
}

bool TrainState::resume() {
  if (config_.resume.empty()) return false;
  std::optional<std::vector<Checkpoint>> files;
  std::string path;
  std::exception_ptr error;
  try {
    files = find_checkpoint(config_, dist_.is_main(), path);
    if (files) apply(files->front(), path, files->front().shard_rank >= 0 ? &*files : nullptr);
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  agree_all_ok(dist_, error, "resuming from the checkpoint");

  // Every rank must continue from the same epoch (a node with another copy of the output dir
  // would silently train a different model).
  const Checkpoint* checkpoint = files ? &files->front() : nullptr;
  const int64_t epoch = checkpoint ? checkpoint->epoch : -1;
  const int64_t epoch_step = checkpoint ? checkpoint->epoch_step : -1;
  auto range =
      torch::tensor({epoch, -epoch, epoch_step, -epoch_step}, torch::TensorOptions(torch::kLong))
          .to(dist_.device);
  dist_.group->all_reduce(range, comm::ReduceOp::kMax)->wait();
  range = range.cpu();
  if (range[0].item<int64_t>() != -range[1].item<int64_t>() ||
      range[2].item<int64_t>() != -range[3].item<int64_t>()) {
    throw InputError(fmt::format(
        "the ranks found different checkpoints (epochs {} to {}): every rank must see the same "
        "output dir '{}'",
        -range[1].item<int64_t>(), range[0].item<int64_t>(), config_.output_dir));
  }
  if (!checkpoint) {
    log::info("--resume auto: no checkpoint in '{}' yet, starting from scratch",
              config_.output_dir);
  }
  return checkpoint != nullptr;
}

void TrainState::apply(const Checkpoint& c, const std::string& path,
                       const std::vector<Checkpoint>* shard_files) {
  batch_size_ = resumable_batch_size(c, path, config_, dist_, batch_size_);
  mode_->load(c, path, shard_files);
  load_shared_state(c, path, scaler_.get(), dist_);
  step_ = c.step;
  start_epoch_ = c.epoch;
  start_epoch_step_ = c.epoch_step;
  start_epoch_samples_ =
      c.epoch_step == 0 ? torch::Tensor()
                        : untrained_samples_of(c, path, config_, dist_, workload_.train_set.size());
  log::info(
      "resumed from {}: epoch {}, step {}{}", path, c.epoch, c.step,
      c.epoch_step == 0 ? "" : fmt::format(" ({} steps into epoch {})", c.epoch_step, c.epoch + 1));
}

Checkpoint TrainState::to_send(const EpochPosition& at, int world) {
  Checkpoint c =
      checkpoint_at({at.epoch, at.epoch_step}, at.rest(), step_, batch_size_, config_, dist_);
  c.world_size = world;
  // The global batch is kept where the new world divides it; else each rank keeps its batch.
  c.batch_size = batch_size_for_world(batch_size_, batch_world_, world).value_or(batch_size_);
  mode_->fill_heal(c);
  const at::Tensor rng = cpu_rng_state().contiguous();
  c.rng_state = rng.unsqueeze(0).repeat({world, 1});  // every rank continues this stream
  if (scaler_) c.grad_scaler = scaler_->state();
  return c;
}

void TrainState::take(const Checkpoint& state, const std::string& origin) {
  batch_size_ = state.batch_size;
  apply(state, origin);
  batch_world_ = dist_.world_size();
  set_schedule();
}

void TrainState::release_group() {
  mode_->release_group();
  if (scaler_) scaler_->set_group(nullptr);  // its inf check's collective, on the next group
}

void TrainState::adopt_group() {
  if (scaler_) scaler_->set_group(dist_.group);
  mode_->adopt_group();
}

}  // namespace ddp::train
