#include "ddp/train/train_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "cpu_rng.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/core/autocast.h"
#include "ddp/core/powersgd.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/train/pt_file.h"
#include "optimizer_state.h"
#include "phase.h"
#include "sharded_checkpoint_writer.h"
#include "sharded_model.h"
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

// "after epoch 2", "5 steps into epoch 3": where a checkpoint is, for the log.
std::string describe(CheckpointPosition at) {
  return at.epoch_step == 0 ? fmt::format("after epoch {}", at.epoch)
                            : fmt::format("{} steps into epoch {}", at.epoch_step, at.epoch + 1);
}

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

// --comm-hook's hook on the model; allreduce registers none (the reducer's own average).
void register_comm_hook(DistributedDataParallel<>& model, const Config& c,
                        const std::shared_ptr<comm::ProcessGroup>& group) {
  switch (c.comm_hook) {
    case CommHook::kAllReduce:
      return;
    case CommHook::kFp16:
      model->register_comm_hook(group, core::fp16_compress_hook);
      return;
    case CommHook::kBf16:
      model->register_comm_hook(group, core::bf16_compress_hook);
      return;
    case CommHook::kPowerSgd:
      model->register_comm_hook(std::make_shared<core::PowerSGDState>(
                                    group, core::PowerSGDOptions()
                                               .matrix_approximation_rank(c.powersgd_rank)
                                               .start_powerSGD_iter(c.powersgd_start_iter)),
                                core::powersgd_hook);
      log::info("comm hook powersgd: rank {}, plain all-reduce for the first {} steps",
                c.powersgd_rank, c.powersgd_start_iter);
      return;
  }
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

std::string model_file_path(const Config& config) {
  return (fs::path(config.output_dir) / "model.pt").string();
}

// The prefix of model.pt's keys, as --save-prefix says.
std::string model_file_prefix(const Config& config) {
  return config.save_prefix == SavePrefix::kNone ? "" : kModulePrefix;
}

// model.pt's contents: `model`'s weights (keys with `module.`) keyed as --save-prefix says.
c10::IValue model_file(const StateDict& model, const Config& config) {
  return to_ivalue(with_prefix(model, model_file_prefix(config)));
}

// The numbered file first (written by `write_numbered`), then the names that point at the newest:
// a kill at any moment leaves every name holding a complete file. Then model.pt, and the
// checkpoints past --keep-last go. Returns the numbered file.
std::string write_checkpoint_files(CheckpointPosition at, const Config& config,
                                   const std::function<void(const std::string&)>& write_numbered,
                                   const std::function<void()>& write_model) {
  const fs::path dir(config.output_dir);
  const std::string numbered = (dir / checkpoint_file_name(at)).string();
  write_numbered(numbered);
  link_atomically(numbered, (dir / "checkpoint.pt").string());
  write_model();
  remove_stale_checkpoints(dir.string(), config.keep_last);
  return numbered;
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

}  // namespace

torch::Tensor EpochPosition::rest() const {
  if (!sequence.defined()) return torch::empty({0}, torch::kLong);
  return sequence.narrow(0, trained, sequence.size(0) - trained).clone();
}

FullyShardOptions fsdp_options(const Config& config) {
  auto dtype = [](const std::string& name) {
    return name == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  };
  MixedPrecisionPolicy policy;
  if (config.fsdp_param_dtype != "float32" || config.fsdp_reduce_dtype != "param-dtype") {
    policy.param_dtype(dtype(config.fsdp_param_dtype));
    if (config.fsdp_reduce_dtype != "param-dtype") {
      policy.reduce_dtype(dtype(config.fsdp_reduce_dtype));
    }
    policy.output_dtype(torch::kFloat32);  // the loss in float32, as autocast computes it
  }
  return FullyShardOptions().mp_policy(policy).reshard_after_forward(config.reshard_after_forward);
}

c10::ScalarType autocast_dtype(Amp amp) {
  return amp == Amp::kFp16 ? torch::kHalf : torch::kBFloat16;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        const std::vector<torch::Tensor>& params) {
  switch (c.optimizer) {
    case Optimizer::kSgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr)
                                                             .momentum(c.momentum)
                                                             .nesterov(c.nesterov)
                                                             .weight_decay(c.weight_decay));
    case Optimizer::kAdam:
      return std::make_unique<torch::optim::Adam>(
          params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
    case Optimizer::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  throw Error(
      fmt::format("make_optimizer: no case for optimizer {}", static_cast<int>(c.optimizer)));
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
      module_(workload.module),
      workload_(workload),
      train_samples_(workload.train_set.size()),
      timeline_(timeline),
      batch_size_(batch_size_per_rank(config, dist.world_size())),
      batch_world_(dist.world_size()) {}

TrainState::~TrainState() = default;

void TrainState::build(bool init_sync) {
  set_up_amp();
  if (config_.fsdp) {  // the shards, and an optimizer of this rank's
    sharded_ = std::make_unique<ShardedModel>(workload_, dist_.group, fsdp_options(config_));
    optimizer_ = make_optimizer(config_, sharded_->parameters());
    return;
  }
  // Before the first collective: an elastic member whose group fails in it re-forms and needs
  // an optimizer for the state it is then given.
  if (!config_.zero) optimizer_ = make_optimizer(config_, module_->parameters());
  wrap_model(init_sync);
  if (config_.sync != "ddp") {  // each rank trains its own copy from here (no_sync every step)
    const DiLoCoOptions options =
        config_.sync == "local-sgd"
            ? DiLoCoOptions::local_sgd(config_.sync_every, config_.sync_delay)
            : DiLoCoOptions{config_.sync_every, config_.outer_lr, config_.outer_momentum, true,
                            config_.sync_delay};
    diloco_ = std::make_unique<DiLoCo>(module_->parameters(), dist_.group, options);
  }
  if (config_.zero) {
    zero_ = std::make_unique<ZeroRedundancyOptimizer>(
        module_->parameters(), dist_.group,
        [this](std::vector<torch::Tensor> shard) { return make_optimizer(config_, shard); });
  }
}

void TrainState::wrap_model(bool init_sync) {
  // Collective unless init_sync is off: checks the model is the same everywhere, broadcasts rank
  // 0's weights.
  auto options = DistributedDataParallelOptions(config_.ddp).init_sync(init_sync);
  // A tuned bucket size (bucket-cap-mb auto), once agreed, is the run's: a group re-formed by an
  // elastic change keeps it, as a resumed run does (start_bucket_tuning).
  if (tuned_bucket_cap_bytes_ > 0) {
    options.bucket_cap_mb(core::bytes_to_mib(tuned_bucket_cap_bytes_));
  }
  model_ = DistributedDataParallel(module_, dist_.group, options);
  register_comm_hook(model_, config_, dist_.group);
}

OptimizerFactory TrainState::factory() const {
  return
      [this](const std::vector<torch::Tensor>& params) { return make_optimizer(config_, params); };
}

void TrainState::zero_grad() {
  if (sharded_) {
    optimizer_->zero_grad();  // the shards' gradients
  } else {
    model_->zero_grad();
  }
}

torch::Tensor TrainState::forward(const torch::Tensor& input) {
  if (!sharded_) return model_->forward_with([&] { return workload_.forward(input); });
  if (config_.ddp.broadcast_buffers() && torch::GradMode::is_enabled()) {
    sharded_->broadcast_buffers();  // as DDP's forward does
  }
  return sharded_->forward(workload_.forward, input);
}

void TrainState::backward(const torch::Tensor& loss) {
  if (sharded_) return sharded_->backward(loss);
  loss.backward();
}

std::vector<fsdp::UnitTimes> TrainState::unit_times() const {
  return sharded_->last_iteration();
}

void TrainState::set_requires_gradient_sync(bool sync) {
  sharded_->set_requires_gradient_sync(sync);
}

void TrainState::before_evaluation() {
  // Rank 0's buffers, as a forward through DDP would use.
  if (!sharded_) {
    model_->pre_forward();
  } else if (config_.ddp.broadcast_buffers()) {
    sharded_->broadcast_buffers();
  }
}

void TrainState::set_up_amp() {
  if (config_.amp == Amp::kOff) return;
  // Every rank finds the same answer, so all stop here together when it is no.
  const c10::DeviceType type = dist_.device.type();
  const std::string unsupported = amp::autocast_unsupported(type, autocast_dtype(config_.amp));
  if (!unsupported.empty()) {
    throw InputError(
        fmt::format("key 'amp': LibTorch {} cannot run {} autocast on {} ({}){}", TORCH_VERSION,
                    to_string(config_.amp), c10::DeviceTypeName(type, true), unsupported,
                    config_.amp == Amp::kFp16 && type == c10::kCPU ? "; bf16 can" : ""));
  }
  if (config_.amp == Amp::kFp16) scaler_ = std::make_unique<amp::GradScaler>(dist_.group);
  log::info("mixed precision: {} autocast on {}{}", to_string(config_.amp),
            c10::DeviceTypeName(type, true),
            scaler_ ? fmt::format(", the loss scaled by a GradScaler from {}", scaler_->get_scale())
                    : "");
}

void TrainState::set_schedule() {
  schedule_ = lr_schedule_of(config_, batch_size_, dist_.world_size());
}

EpochPosition TrainState::position() const {
  return {start_epoch_, start_epoch_step_, start_epoch_step_, start_epoch_samples_, 0};
}

void TrainState::count_step(double step_seconds) {
  ++step_;
  tune_buckets(step_seconds);
  if (diloco_) {  // --sync local-sgd, diloco: every sync-every steps, the models meet
    const Phase phase = step_phase(*dist_.group, timeline_, "synchronization", step_);
    diloco_->after_inner_step();
  }
}

void TrainState::set_lr(double lr) {
  for (auto& group : optimizer().param_groups()) group.options().set_lr(lr);
}

void TrainState::optimizer_step() {
  // Its collectives (the GradScaler's inf check, ZeRO's broadcasts) under a label of their own.
  const Phase phase(*dist_.group, fmt::format("step {}: optimizer", step_ + 1), timeline_,
                    "optimizer step", "compute", step_ + 1);
  // --amp fp16: the true gradients first, and whether any rank has an inf or NaN in them.
  if (scaler_) scaler_->unscale_(*optimizer_);
  if (config_.clip_grad_norm > 0 && sharded_) {
    sharded_->clip_grad_norm(config_.clip_grad_norm);  // the norm over every rank's shards
  } else if (config_.clip_grad_norm > 0) {
    torch::nn::utils::clip_grad_norm_(module_->parameters(), config_.clip_grad_norm);
  }
  if (scaler_) {
    // Skipped on every rank after an inf or NaN, with the scale halved (PyTorch's rule).
    if (!scaler_->step(*optimizer_)) log::debug("step {}: skipped (inf or NaN)", step_ + 1);
    scaler_->update();
  } else if (zero_) {
    zero_->step();  // this rank's shard, then each shard broadcast from its owner
  } else {
    optimizer_->step();
  }
}

void TrainState::start_bucket_tuning() {
  if (tuned_bucket_cap_bytes_ > 0) {
    const double mb = core::bytes_to_mib(tuned_bucket_cap_bytes_);
    model_->set_bucket_cap_mb(mb);
    log::info("bucket-cap-mb auto: {} MiB, as the checkpoint's run chose", mb);
    return;
  }
  if (dist_.world_size() == 1) {
    log::info("bucket-cap-mb auto: one rank communicates nothing; buckets of {} MiB",
              config_.ddp.bucket_cap_mb());
    return;
  }
  const core::Reducer& reducer = model_->reducer();
  std::vector<double> candidates = core::bucket_cap_candidates(
      reducer.slots(), core::mib_to_bytes(config_.ddp.first_bucket_mb()), reducer.bucket_order());
  if (candidates.size() == 1) {
    model_->set_bucket_cap_mb(candidates[0]);
    tuned_bucket_cap_bytes_ = static_cast<int64_t>(core::mib_to_bytes(candidates[0]));
    log::info(
        "bucket-cap-mb auto: every size from 0.5 to 100 MiB cuts this model's gradients "
        "into the same buckets; {} MiB",
        candidates[0]);
    return;
  }
  bucket_tuner_ = std::make_unique<core::BucketCapTuner>(std::move(candidates));
  model_->set_bucket_cap_mb(bucket_tuner_->cap_mb());
  log::info("bucket-cap-mb auto: the first {} steps try {} MiB", bucket_tuner_->steps(),
            fmt::join(bucket_tuner_->caps_mb(), ", "));
}

void TrainState::tune_buckets(double step_seconds) {
  if (!bucket_tuner_ || !bucket_tuner_->record(step_seconds)) return;
  if (!bucket_tuner_->done()) {
    model_->set_bucket_cap_mb(bucket_tuner_->cap_mb());
    return;
  }
  const Phase phase = step_phase(*dist_.group, timeline_, "bucket tuning", step_);
  const double mb = bucket_tuner_->agree(*dist_.group, dist_.device);
  model_->set_bucket_cap_mb(mb);
  tuned_bucket_cap_bytes_ = static_cast<int64_t>(core::mib_to_bytes(mb));
  std::vector<std::string> trials;
  for (size_t i = 0; i < bucket_tuner_->caps_mb().size(); ++i) {
    trials.push_back(fmt::format("{} MiB {:.1f} ms", bucket_tuner_->caps_mb()[i],
                                 1e3 * bucket_tuner_->agreed_seconds()[i]));
  }
  log::info("bucket-cap-mb auto: keeps {} MiB (median step of the slowest rank: {})", mb,
            fmt::join(trials, ", "));
  bucket_tuner_.reset();
}

uint64_t TrainState::digest() {
  Digest d;
  for (const auto& p : module_->parameters()) d.add(p);
  for (const auto& b : module_->buffers()) d.add(b);
  add_optimizer_state(d, optimizer(), module_->parameters());
  if (scaler_) {
    const amp::GradScalerState& s = scaler_->state();
    d.add_value(s.scale);
    d.add_value(s.growth_tracker);
  }
  d.add(cpu_rng_state());
  d.add_value(step_);
  return d.value();
}

Checkpoint TrainState::checkpoint_here(CheckpointPosition at, const torch::Tensor& untrained,
                                       StateDict model) const {
  Checkpoint c;
  c.epoch = at.epoch;
  c.epoch_step = at.epoch_step;
  c.epoch_samples = untrained;
  c.step = step_;
  c.world_size = dist_.world_size();
  c.batch_size = batch_size_;
  c.seed = config_.seed;
  c.optimizer = to_string(config_.optimizer);
  c.config = to_yaml(config_);
  c.model = sharded_ ? std::move(model) : state_dict(*module_, kModulePrefix);
  c.bucket_cap_bytes = tuned_bucket_cap_bytes_;
  return c;
}

std::string TrainState::save(CheckpointPosition at, const torch::Tensor& untrained) {
  if (config_.checkpoint_sharded) return save_sharded(at, untrained);
  if (sharded_) return save_gathered(at, untrained);
  const std::string what = describe(at);
  // Every rank's RNG state, for rank 0 to write: a collective, so all ranks are here.
  const at::Tensor all_rng = all_rng_states(dist_);
  // --zero: every rank's shard of the optimizer state, for rank 0 to write; --sync local-sgd or
  // diloco: every rank's inner optimizer.
  const bool per_rank = zero_ || diloco_;
  std::string opt = per_rank || dist_.is_main() ? serialized(optimizer()) : std::string();
  const std::vector<std::string> shards =
      per_rank ? comm::all_gather_bytes(*dist_.group, opt, dist_.device)
               : std::vector<std::string>();

  std::exception_ptr error;
  std::string numbered;  // rank 0's file
  if (dist_.is_main()) {
    try {
      Checkpoint c = checkpoint_here(at, untrained);
      c.optimizer_state = zero_ ? torch::empty({0}, torch::kByte) : byte_tensor(std::move(opt));
      auto& per_rank_states = zero_ ? c.optimizer_shards : c.inner_optimizers;
      for (const auto& shard : shards) per_rank_states.push_back(byte_tensor(shard));
      if (diloco_) {
        for (size_t i = 0; i < diloco_->momentum().size(); ++i) {
          c.outer_momentum.emplace_back(std::to_string(i), diloco_->momentum()[i].cpu());
        }
      }
      c.rng_state = all_rng;
      if (scaler_) c.grad_scaler = scaler_->state();
      numbered = write_checkpoint_files(
          at, config_, [&](const std::string& path) { write_pt_file(path, to_ivalue(c)); },
          [&] { write_pt_file(model_file_path(config_), model_file(c.model, config_)); });
      log::info("checkpoint {}: {}", what, numbered);
    } catch (const std::exception& e) {
      log::error("saving the checkpoint {} failed: {}", what, first_line_of(e));
      error = std::current_exception();
    }
  }
  // The barrier after every save, carrying rank 0's outcome.
  agree_all_ok(dist_, error, "saving the checkpoint");
  return fmt::format("{} ({})", numbered, what);
}

// --fsdp: the checkpoint a DDP run writes, and model.pt, streamed by rank 0 while the units are
// gathered one at a time (their parameters, then their optimizer state), so that no rank ever
// holds the whole model or the whole optimizer state.
std::string TrainState::save_gathered(CheckpointPosition at, const torch::Tensor& untrained) {
  const std::string what = describe(at);
  const at::Tensor all_rng = all_rng_states(dist_);  // a collective
  StreamedFiles files;
  ShardedState::Deferred state;  // rank 0's
  PtFileWriter* checkpoint = nullptr;
  PtFileWriter* model = nullptr;
  if (dist_.is_main()) {
    try {
      state = sharded_->state().deferred_state(kModulePrefix, optimizer_.get(), factory());
      Checkpoint c = checkpoint_here(at, untrained, state.model);
      c.optimizer_state = byte_tensor(std::move(state.optimizer_state));
      c.optimizer_tensors = state.optimizer_tensors;
      c.rng_state = all_rng;
      if (scaler_) c.grad_scaler = scaler_->state();
      checkpoint = &files.open((fs::path(config_.output_dir) / checkpoint_file_name(at)).string(),
                               to_ivalue(c));
      model = &files.open(model_file_path(config_), model_file(state.model, config_));
    } catch (...) {
      files.error = std::current_exception();
    }
  }
  sharded_->state().write_gathered(state, optimizer_.get(), files.writer(dist_.is_main()));
  std::string numbered;
  if (dist_.is_main()) {
    try {
      if (files.error) std::rethrow_exception(files.error);
      numbered = write_checkpoint_files(
          at, config_, [&](const std::string&) { checkpoint->commit(); }, [&] { model->commit(); });
      log::info("checkpoint {}: {}", what, numbered);
    } catch (const std::exception& e) {
      log::error("saving the checkpoint {} failed: {}", what, first_line_of(e));
      files.error = std::current_exception();
    }
  }
  agree_all_ok(dist_, files.error, "saving the checkpoint");
  return fmt::format("{} ({})", numbered, what);
}

std::string TrainState::save_sharded(CheckpointPosition at, const torch::Tensor& untrained) {
  if (!sharded_writer_) sharded_writer_ = std::make_unique<ShardedCheckpointWriter>(config_, dist_);
  const std::string dir = sharded_writer_->begin(at);  // the previous one settled first
  Checkpoint c = checkpoint_here(at, untrained, {});
  c.rng_state = all_rng_states(dist_);
  const bool async = config_.checkpoint_async;
  sharded_->state().fill_rank_file(c, *optimizer_, factory(), /*copy=*/async);
  sharded_writer_->write(std::move(c), async);
  if (async) {
    log::info("checkpoint {}: {} (each rank writing its file in the background)", describe(at),
              dir);
  } else {
    sharded_writer_->settle();  // every rank's file written, older checkpoints deleted
  }
  return fmt::format("{} ({})", dir, describe(at));
}

void TrainState::finish_saving() {
  if (!sharded_writer_) return;
  sharded_writer_->settle();
  std::exception_ptr error;
  try {  // written by rank 0 as the units are gathered: every rank takes part
    sharded_->save_weights(model_file_path(config_), dist_.is_main(), model_file_prefix(config_));
  } catch (...) {
    error = std::current_exception();
  }
  agree_all_ok(dist_, error, "saving model.pt");
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
  if (c.shard_rank >= 0 && (!sharded_ || shard_files == nullptr)) {
    throw InputError(fmt::format(
        "{}: {} of a sharded checkpoint (--checkpoint-sharded), which resumes under --fsdp from "
        "its directory; model.pt holds the weights whole",
        path, shard_files == nullptr ? "one rank's file" : "the directory"));
  }
  check_resumable(c, path);  // may change the batch size per rank
  if (shard_files != nullptr) {
    sharded_->state().load_shards(*shard_files, *optimizer_, factory(), path);
  } else if (sharded_) {
    sharded_->state().load_state_dict(c.model, path);  // this rank's shards of it
  } else {
    load_state_dict(*module_, c.model, path);
  }
  load_training_state(c, path);
  step_ = c.step;
  start_epoch_ = c.epoch;
  start_epoch_step_ = c.epoch_step;
  start_epoch_samples_ = c.epoch_step == 0 ? torch::Tensor() : untrained_samples_of(c, path);
  log::info(
      "resumed from {}: epoch {}, step {}{}", path, c.epoch, c.step,
      c.epoch_step == 0 ? "" : fmt::format(" ({} steps into epoch {})", c.epoch_step, c.epoch + 1));
}

torch::Tensor TrainState::untrained_samples_of(const Checkpoint& c, const std::string& path) const {
  const int64_t size = train_samples_;
  if (!c.epoch_samples.defined()) {
    // Written before checkpoints held the ids: its world took the sampler's sequence in strides.
    const torch::Tensor sequence = epoch_sequence(config_, train_samples_, c.epoch, c.world_size);
    const int64_t trained = data::trained_prefix(
        sequence.size(0), c.world_size, c.epoch_step * c.batch_size * config_.grad_accum_steps);
    return sequence.narrow(0, trained, sequence.size(0) - trained);
  }
  const torch::Tensor& ids = c.epoch_samples;
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= size)) {
    throw InputError(fmt::format(
        "{}: 'epoch_samples' holds sample ids from {} to {}, outside the {} training samples of "
        "this run's data",
        path, ids.min().item<int64_t>(), ids.max().item<int64_t>(), size));
  }
  if (c.world_size != dist_.world_size() && dist_.is_main()) {
    log::info("{}: epoch {}'s {} untrained samples are shared by {} ranks, not {}", path,
              c.epoch + 1, ids.numel(), dist_.world_size(), c.world_size);
  }
  return ids;
}

void TrainState::check_resumable(const Checkpoint& c, const std::string& path) {
  if (c.batch_size == 0) {
    throw InputError(fmt::format(
        "{}: a checkpoint of a model and its optimizer alone (ddp::train::ShardedCheckpoint), "
        "with no training position to resume from",
        path));
  }
  if (c.optimizer != to_string(config_.optimizer)) {
    throw InputError(fmt::format("{}: saved with optimizer '{}', but the run uses '{}'", path,
                                 c.optimizer, to_string(config_.optimizer)));
  }
  const int64_t world = dist_.world_size();
  if (c.world_size != world) {
    const auto batch = batch_size_for_world(c.batch_size, c.world_size, world);
    if (!batch) {
      throw InputError(fmt::format(
          "{}: saved by {} ranks with batch size {} (global batch {}), which {} ranks cannot "
          "share evenly; resume on a world size that divides {}",
          path, c.world_size, c.batch_size, c.batch_size * c.world_size, world,
          c.batch_size * c.world_size));
    }
    if (dist_.is_main()) {
      log::warn(
          "{}: saved by {} ranks, resumed on {}: batch size per rank {} -> {} keeps the "
          "global batch {}",
          path, c.world_size, world, c.batch_size, *batch, c.batch_size * c.world_size);
    }
    batch_size_ = *batch;
  }
  if (dist_.is_main()) {
    for (const auto& change : changed_settings(c.config, to_yaml(config_), kFreeOnResume)) {
      log::warn("{}: resuming with a changed setting, {}", path, change);
    }
  }
}

void TrainState::load_training_state(const Checkpoint& c, const std::string& path) {
  tuned_bucket_cap_bytes_ = c.bucket_cap_bytes;
  load_optimizer_state(c, path);
  if (scaler_ && c.grad_scaler) {
    scaler_->load_state(*c.grad_scaler);
  } else if (scaler_ && dist_.is_main()) {
    log::warn("{}: saved without --amp fp16: the GradScaler starts from scale {}", path,
              scaler_->get_scale());
  }
  // Each rank continues its own random stream; a rank the checkpoint did not have takes rank 0's.
  const int64_t row = dist_.rank() < c.world_size ? dist_.rank() : 0;
  try {
    set_cpu_rng_state(c.rng_state[row].contiguous());
  } catch (const c10::Error& e) {
    throw InputError(
        fmt::format("{}: the RNG state cannot be restored: {}", path, first_line_of(e)));
  }
}

void TrainState::load_optimizer_state(const Checkpoint& c, const std::string& path) {
  if (zero_ && static_cast<int64_t>(c.optimizer_shards.size()) != dist_.world_size() &&
      !c.optimizer_shards.empty()) {
    const int saved_world = load_resharded_zero_state(
        c, path, factory(), *zero_, module_->parameters(), dist_.rank(), dist_.device);
    if (dist_.is_main()) {
      log::info("{}: the optimizer state of {} ranks' shards resharded over {} ranks", path,
                saved_world, dist_.world_size());
    }
  } else if (diloco_) {
    load_sync_state(c, path);
  } else if (sharded_ && c.shard_rank >= 0) {
    return;               // loaded with the model's shards (apply)
  } else if (sharded_) {  // this rank's part of the per-parameter state
    sharded_->state().load_unsharded_optimizer_state(*optimizer_, zero_state_of(c, path, false, 0),
                                                     c.optimizer_tensors, factory(), path);
  } else {
    load_optimizer(optimizer(), zero_state_of(c, path, config_.zero, dist_.rank()), path,
                   dist_.device);
    // A sharded run's checkpoint keeps the element-wise state apart.
    restore_optimizer_tensors(optimizer(), module_->parameters(), c.optimizer_tensors, path,
                              dist_.device);
  }
}

// --sync local-sgd, diloco: this rank's own inner optimizer, and the outer momentum; the model
// just loaded becomes the global parameters. From a checkpoint of a run without --sync, every
// rank's inner optimizer starts from its optimizer state and the momentum from nothing.
void TrainState::load_sync_state(const Checkpoint& c, const std::string& path) {
  if (c.inner_optimizers.empty()) {
    load_optimizer(optimizer(), c.optimizer_state, path, dist_.device);
    restore_optimizer_tensors(optimizer(), module_->parameters(), c.optimizer_tensors, path,
                              dist_.device);
    diloco_->restart({});
    return;
  }
  if (static_cast<int>(c.inner_optimizers.size()) != dist_.world_size()) {
    throw InputError(
        fmt::format("{}: saved by {} ranks with --sync {}, each with an optimizer of "
                    "its own; resume it on {} ranks",
                    path, c.inner_optimizers.size(), config_.sync, c.inner_optimizers.size()));
  }
  load_optimizer(optimizer(), c.inner_optimizers[static_cast<size_t>(dist_.rank())], path,
                 dist_.device);
  std::vector<at::Tensor> momentum;
  for (const auto& [index, tensor] : c.outer_momentum) momentum.push_back(tensor.to(dist_.device));
  diloco_->restart(std::move(momentum));
}

Checkpoint TrainState::to_send(const EpochPosition& at, int world) {
  Checkpoint c = checkpoint_here({at.epoch, at.epoch_step}, at.rest(), {});
  c.world_size = world;
  // The global batch is kept where the new world divides it; else each rank keeps its batch.
  c.batch_size = batch_size_for_world(batch_size_, batch_world_, world).value_or(batch_size_);
  c.optimizer_state = byte_tensor(serialized(optimizer()));
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
  // The old generation's group goes with the DDP wrapper (whose reducer holds it and whose hooks
  // it removes) and the GradScaler's use of it; the model, the optimizer and the data stay.
  model_ = nullptr;
  if (scaler_) scaler_->set_group(nullptr);  // its inf check's collective, on the next group
}

void TrainState::adopt_group() {
  if (scaler_) scaler_->set_group(dist_.group);
  wrap_model(/*init_sync=*/false);  // Note [One state transfer per change]: the heal's is the one
}

}  // namespace ddp::train
