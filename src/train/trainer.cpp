#include "ddp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
#include "ddp/core/sync_batch_norm.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/data/loader.h"
#include "ddp/train/progress.h"
#include "ddp/train/state_dict.h"
#include "phase.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// Set by request_stop_from_signal() (a signal handler); read once per step by stop_requested().
volatile sig_atomic_t g_stop_requested = 0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

// Creates `dir` (and its parents) and checks that this process can write there.
void make_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("output dir '{}': cannot create it: {}", dir, ec.message()));
  check_writable_dir(dir);
}

// The reducer's part of the backward just run, inside backward's span: the moment the last
// gradient was ready (an all-reduce that began before it overlapped the gradients' computation),
// the finalize, and each bucket's all-reduce from launch to completion, on the bucket's lane.
void record_reducer(Timeline& timeline, const core::IterationStats& s, int64_t step) {
  if (s.finalize_start == core::Clock::time_point()) return;  // no synchronised backward
  timeline.add("last gradient ready", "compute", Timeline::kStepLane, s.last_grad, s.last_grad,
               step);
  timeline.add("finalize: wait for all-reduces", "comm", Timeline::kStepLane, s.finalize_start,
               s.finalize_end, step);
  if (!s.communicated) return;
  for (size_t b = 0; b < s.bucket_launch.size(); ++b) {
    timeline.add("all-reduce", "comm", Timeline::kBucketLane + static_cast<int>(b),
                 s.bucket_launch[b], s.bucket_done[b], step, s.bucket_bytes[b]);
  }
}

// The bytes the step's gradient collectives carried (0 on one rank without a hook).
int64_t gradient_bytes(const core::IterationStats& s) {
  int64_t total = 0;
  for (int64_t bytes : s.bucket_bytes) total += bytes;
  return total;
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

}  // namespace

void request_stop_from_signal() {
  g_stop_requested = 1;
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

namespace {

// Checks everything a user can get wrong before any rank waits for the others.
Config prepared(Config config) {
  validate(config);
  if (config.nesterov && (config.optimizer != Optimizer::kSgd || config.momentum <= 0.0)) {
    throw InputError("key 'nesterov': needs optimizer sgd with a momentum > 0");
  }
  // Join matches collectives step by step; these add their own to some steps (fp16: the
  // GradScaler's inf check; the sample record's gather), or (accumulation) give ranks still
  // training different numbers of micro-batches in their last step.
  if (config.uneven &&
      (config.drop_last || config.checkpoint_on_signal || config.check_params_every > 0 ||
       config.grad_accum_steps > 1 || config.amp == Amp::kFp16 || config.record_samples)) {
    throw InputError(
        "key 'uneven': cannot be combined with drop-last, checkpoint-on-signal, "
        "check-params-every, grad-accum-steps, amp fp16 or record-samples");
  }
  // The GradScaler unscales the gradients of the optimizer it steps, and --zero's steps a shard.
  if (config.amp == Amp::kFp16 && config.zero) {
    throw InputError(
        "key 'amp': fp16 (with its GradScaler) cannot be combined with zero; bf16 can");
  }
  make_writable_dir(config.output_dir);
  if (!config.timeline.empty()) {  // fail now, not after the whole run
    make_writable_dir(std::filesystem::absolute(config.timeline).parent_path().string());
  }
  return config;
}

// The watchdog of this rank's group: the stall warning after --stall-warning seconds, and the
// flight record to <output>/debug/rank<r>.json and to the launcher's DDP_FLIGHT_DIR.
std::unique_ptr<comm::Watchdog> start_watchdog(const Config& config, const Distributed& dist,
                                               const comm::Env& env) {
  comm::WatchdogOptions options;
  options.stall_warning =
      std::chrono::milliseconds(static_cast<int64_t>(config.stall_warning * 1000.0));
  const std::string file = fmt::format("rank{}.json", dist.rank());
  options.dump_path = (std::filesystem::path(config.output_dir) / "debug" / file).string();
  if (auto dir = env.find("DDP_FLIGHT_DIR"); dir != env.end() && !dir->second.empty()) {
    options.launcher_copy = (std::filesystem::path(dir->second) / file).string();
  }
  return std::make_unique<comm::Watchdog>(dist.group, options);
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

c10::ScalarType autocast_dtype(Amp amp) {
  return amp == Amp::kFp16 ? torch::kHalf : torch::kBFloat16;
}

}  // namespace

Trainer::Trainer(Config config) : Trainer(std::move(config), Distributed{}) {}

Trainer::Trainer(Config config, Distributed dist)
    : config_(prepared(std::move(config))),
      dist_(dist.group ? std::move(dist) : init_distributed(config_, comm::current_env())),
      watchdog_(start_watchdog(config_, dist_, comm::current_env())),
      timeline_(config_.timeline.empty() ? nullptr : std::make_unique<Timeline>()),
      timer_(dist_, {config_.straggler_threshold, config_.straggler_every, config_.uneven},
             timeline_.get()) {
  progress_style_ =
      progress_style(config_.progress, ::isatty(STDOUT_FILENO) != 0,
                     dist_.launch.launcher == comm::Launcher::kMpirun, dist_.is_main());
  elastic_ = std::make_unique<ElasticMember>(
      dist_, static_cast<ElasticTrainee&>(*this), timeline_.get(),
      ElasticMember::Options{config_.output_dir, config_.record_samples, config_.log_level});
  // A group the launcher (or torchrun) restarted continues from its last checkpoint; an elastic
  // worker that joins a running group takes its state instead.
  const bool joiner = elastic_->enabled() && dist_.joining;
  if (config_.resume.empty() && dist_.launch.restart_count != 0 && !joiner) {
    log::info("restart {} of the job: resuming from the newest checkpoint in '{}'",
              dist_.launch.restart_count, config_.output_dir);
    config_.resume = "auto";
  }
  // Intra-op threads: --threads, else LibTorch's default unless this host's ranks share cores.
  const int threads = threads_for_this_process(static_cast<int>(config_.threads),
                                               comm::current_env(), dist_.launch.local_world_size);
  if (threads > 0) {
    if (config_.threads == 0 && dist_.is_main()) {
      log::info(
          "intra-op threads per rank: {} of LibTorch's {}, so that this host's {} rank(s) "
          "do not share cores (--threads or OMP_NUM_THREADS choose otherwise)",
          threads, torch::get_num_threads(), dist_.launch.local_world_size);
    }
    set_intra_op_threads(threads);
  }
  batch_size_ = batch_size_per_rank(config_, dist_.world_size());
  batch_world_ = dist_.world_size();
  bool resumed = false;
  if (joiner) {
    build_model(/*init_sync=*/false);  // the group's state comes whole when it joins (run())
  } else if (!elastic_->attempt([&] {
               build_model(/*init_sync=*/true);
               resumed = resume_if_asked();  // may change batch_size_
             })) {
    resumed = step_ > 0;  // --elastic: re-formed meanwhile, and healed
  }
  schedule_ = lr_schedule_of(config_, batch_size_, dist_.world_size());
  if (dist_.is_main()) write_run_files(resumed);
}

Trainer::~Trainer() = default;

void Trainer::build_model(bool init_sync) {
  models::NormFactory norm;
  if (config_.sync_bn) {
    norm = [group = dist_.group](int64_t channels) {
      return torch::nn::AnyModule(SyncBatchNorm(channels, group));
    };
  }
  workload_ = make_workload(config_, norm);
  if (workload_.train_set.size() < dist_.world_size()) {
    throw InputError(fmt::format("{} training samples cannot be shared by {} ranks",
                                 workload_.train_set.size(), dist_.world_size()));
  }
  workload_.module->to(dist_.device);
  if (!config_.init_weights.empty()) {
    load_weights(*workload_.module, config_.init_weights);
    log::info("initial weights from {}", config_.init_weights);
  }
  set_up_amp();
  // Before the first collective: an elastic member whose group fails in it re-forms and needs
  // an optimizer for the state it is then given.
  if (!config_.zero) optimizer_ = make_optimizer(config_, workload_.module->parameters());
  wrap_model(init_sync);
  if (config_.sync != "ddp") {  // each rank trains its own copy from here (no_sync every step)
    const DiLoCoOptions options =
        config_.sync == "local-sgd"
            ? DiLoCoOptions::local_sgd(config_.sync_every, config_.sync_delay)
            : DiLoCoOptions{config_.sync_every, config_.outer_lr, config_.outer_momentum, true,
                            config_.sync_delay};
    diloco_ = std::make_unique<DiLoCo>(workload_.module->parameters(), dist_.group, options);
  }
  if (config_.zero) {
    zero_ = std::make_unique<ZeroRedundancyOptimizer>(
        workload_.module->parameters(), dist_.group,
        [this](std::vector<torch::Tensor> shard) { return make_optimizer(config_, shard); });
  }
}

void Trainer::wrap_model(bool init_sync) {
  // Collective unless init_sync is off: checks the model is the same everywhere, broadcasts rank
  // 0's weights.
  auto options = DistributedDataParallelOptions(config_.ddp).init_sync(init_sync);
  // A tuned bucket size (bucket-cap-mb auto), once agreed, is the run's: a group re-formed by an
  // elastic change keeps it, as a resumed run does (start_bucket_tuning).
  if (tuned_bucket_cap_bytes_ > 0) {
    options.bucket_cap_mb(core::bytes_to_mib(tuned_bucket_cap_bytes_));
  }
  model_ = DistributedDataParallel(workload_.module, dist_.group, options);
  register_comm_hook(model_, config_, dist_.group);
}

bool Trainer::resume_if_asked() {
  return !config_.resume.empty() && resume();
}

void Trainer::set_up_amp() {
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

void Trainer::write_run_files(bool resumed) const {
  const auto dir = std::filesystem::path(config_.output_dir);
  write_file_atomically((dir / "config.yaml").string(), to_yaml(config_));
  if (!resumed) return;
  // The epochs and steps after the checkpoint's are trained again: the records say what the
  // model now holds, each epoch and step once.
  const auto metrics = (dir / "metrics.jsonl").string();
  const std::string kept = std::filesystem::exists(metrics) ? read_file(metrics) : "";
  write_file_atomically(metrics, metrics_up_to(kept, start_epoch_));
  const auto samples = (dir / "samples.jsonl").string();
  if (config_.record_samples && std::filesystem::exists(samples)) {
    write_file_atomically(samples, records_up_to(read_file(samples), "step", step_));
  }
}

TrainResult Trainer::run() {
  try {
    TrainResult result = train();
    if (timeline_) write_timeline(*dist_.group, dist_.device, *timeline_, config_.timeline);
    return result;
  } catch (const comm::CommError&) {
    // The evidence for the hang doctor: this rank's last collectives (none when an elastic
    // member's last generation never formed).
    const auto path = watchdog_ ? watchdog_->dump_flight_record("collective failed") : "";
    if (!path.empty()) {
      log::error("rank {}: flight record written to {}; ddp_train --diagnose {} merges the ranks'",
                 dist_.rank(), path, config_.output_dir);
    }
    throw;
  }
}

TrainResult Trainer::train() {
  elastic_->join();  // --elastic, a worker that joins a running group: its state, once
  TrainResult result;
  result.metrics_path = (std::filesystem::path(config_.output_dir) / "metrics.jsonl").string();
  // Rank 0 owns the files; a joiner that is rank 0 after a change goes on with them.
  if (dist_.is_main() && !metrics_file_)
    metrics_file_.emplace(result.metrics_path, /*append=*/start_epoch_ > 0 || dist_.joining);
  if (start_epoch_ >= config_.epochs) {
    log::info("the checkpoint is at epoch {} of {}: nothing left to train", start_epoch_,
              config_.epochs);
    elastic_->done_training();
    return result;
  }
  const int64_t global = batch_size_ * dist_.world_size() * config_.grad_accum_steps;
  log::info(
      "training {} on {} ({} train / {} test samples) on {} rank(s), {} threads each, batch {} "
      "per rank{} ({} global)",
      config_.model, config_.dataset, workload_.train_set.size(), workload_.test_set.size(),
      dist_.world_size(), torch::get_num_threads(), batch_size_,
      config_.grad_accum_steps > 1
          ? fmt::format(" x {} accumulated micro-batches", config_.grad_accum_steps)
          : "",
      global);

  if (config_.bucket_cap_auto) start_bucket_tuning();
  for (int64_t epoch = start_epoch_; epoch < config_.epochs;) {
    EpochMetrics m;
    m.epoch = epoch + 1;
    // --elastic: a change of the group's members ends the attempt; the group re-forms and every
    // member takes one state (elastic_member.h).
    const bool kept = elastic_->attempt(
        [&] { result.stopped_by_signal = !train_epoch(epoch, m) || end_of_epoch(m, result); });
    if (result.stopped_by_signal) return result;
    epoch = kept ? epoch + 1 : start_epoch_;  // re-formed: on from where the state taken is
  }
  elastic_->done_training();  // --elastic: what follows is the job's ending, not its training

  const EpochMetrics& final = result.epochs.back();
  log::info("done: {} epochs, {}, {:.0f} samples/s; metrics in {}", config_.epochs, describe(final),
            final.samples_per_s, result.metrics_path);
  timer_.log_table();
  return result;
}

bool Trainer::end_of_epoch(EpochMetrics& m, TrainResult& result) {
  const bool last = m.epoch == config_.epochs;
  // The run's last window, however short: a run of fewer steps than --straggler-every has its
  // figures and its table too.
  if (last) timer_.exchange_rest(step_);

  // Every eval_every epochs, and always after the last one (all ranks).
  if (last || (config_.eval_every > 0 && m.epoch % config_.eval_every == 0)) {
    evaluate_epoch(m, last);
  }

  // Log and record the epoch (rank 0; once, though --elastic may end an epoch again).
  log::info("epoch {}/{}: {}, {:.0f} samples/s, {:.2f} s, lr {:.4g}", m.epoch, config_.epochs,
            describe(m), m.samples_per_s, m.epoch_seconds, m.lr);
  if (result.epochs.empty() || result.epochs.back().epoch < m.epoch) {
    m.membership_changes = elastic_->take_records();
    timer_.take_epoch(m);  // the step times of this epoch's windows (rank 0)
    if (metrics_file_) metrics_file_->write(m);
    result.epochs.push_back(m);
  }

  // Checkpoint every save_every epochs and after the last one (all ranks; rank 0 writes).
  const bool save = last || (config_.save_every > 0 && m.epoch % config_.save_every == 0);
  if (save) checkpoint_epoch(m.epoch);

  // A SIGTERM during the evaluation or the checkpoint stops the run here (all ranks).
  return !last && stop_after_epoch(m.epoch, save);
}

void Trainer::evaluate_epoch(EpochMetrics& m, bool last) {
  const Phase phase(*dist_.group, fmt::format("epoch {}: evaluation", m.epoch), timeline_.get(),
                    "evaluation", "compute");
  if (workload_.val_set) m.val = evaluate(*workload_.val_set);
  if (last || !workload_.val_set) m.test = evaluate(workload_.test_set);
}

void Trainer::checkpoint_epoch(int64_t epoch) {
  const Phase phase(*dist_.group, fmt::format("epoch {}: checkpoint", epoch), timeline_.get(),
                    "checkpoint", "io");
  save_checkpoint({epoch, 0});
}

bool Trainer::stop_after_epoch(int64_t epoch, bool saved) {
  if (!stop_requested()) return false;
  if (!saved) save_checkpoint({epoch, 0});
  log::warn("stopped by SIGTERM after epoch {}; --resume auto continues", epoch);
  return true;
}

// One epoch's training pass, from begin_epoch() to end_epoch().
struct Trainer::EpochPass {
  int64_t epoch = 0;  // 0-based
  int64_t steps = 0;  // optimizer steps of the whole epoch: the same on every rank
  int64_t step = 0;   // steps of this epoch done (a resumed epoch starts after the checkpoint's)
  int64_t first_step = 0;  // the step this pass started after
  // The sample ids this pass trains, in strides over the ranks (see Note [An epoch is a sequence
  // the ranks take in strides]): the epoch's whole sequence, or a resumed epoch's rest.
  torch::Tensor sequence;
  torch::Tensor order;      // this rank's ids, in the order its loader takes them
  bool first = false;       // the run's first step: its shapes are logged
  bool pin_memory = false;  // pinned batches: copied to the GPU without blocking
  int64_t trained = 0;      // samples
  int64_t grad_bytes = 0;   // handed to the gradients' collectives by this rank
  torch::Tensor loss_sum;   // on the device, so the loop never waits for it
  Clock::time_point start;
  std::unique_ptr<data::BatchLoader> loader;
  std::optional<EpochProgress> progress;

  // After a step that trained on `samples` whose losses sum to `losses` (float64).
  void count_step(const torch::Tensor& losses, int64_t samples) {
    loss_sum += losses;
    trained += samples;
    progress->update(++step, trained, [this] { return running_loss(); });
  }
  // rank 0's shard only: no collective for a progress line
  double running_loss() const {
    return trained > 0 ? loss_sum.item<double>() / static_cast<double>(trained) : 0.0;
  }
};

bool Trainer::train_epoch(int64_t epoch, EpochMetrics& m) {
  EpochPass pass = begin_epoch(epoch);
  elastic_->reached(position_of(pass));  // --elastic: a failure from here goes on from here
  return train_steps(pass, m);
}

bool Trainer::train_steps(EpochPass& pass, EpochMetrics& m) {
  // --uneven: a rank out of batches joins the others' steps until all are done (core/join.h).
  if (config_.uneven) model_->begin_join();
  while (true) {
    const std::optional<std::vector<data::Batch>> batches = step_batches(pass);
    if (!batches) break;
    const auto step_start = Clock::now();
    m.lr = lr_at(schedule_, step_, pass.steps);
    set_lr(optimizer(), m.lr);
    model_->zero_grad();  // dropped: the next backward's gradients become .grad (see the header)

    // Forward and backward of each micro-batch; the last backward reduces their gradients.
    // --elastic: applied only where every member's gradients were reduced; a step that failed
    // anywhere is dropped everywhere (elastic_member.h).
    std::pair<torch::Tensor, int64_t> reduced;
    std::vector<std::string> ids;  // --record-samples: every rank's
    elastic_->commit([&] {
      {
        const auto timed = timer_.time(StepPhase::kCompute);
        reduced = step_gradients(pass, *batches);
      }
      if (config_.record_samples) ids = gather_sample_ids(pass);
    });
    {
      const auto timed = timer_.time(StepPhase::kOptimizer);
      optimizer_step();  // on the reduced gradients, the same on every rank
    }
    ++step_;
    timer_.count_step();
    if (bucket_tuner_) tune_buckets(seconds_since(step_start));
    if (diloco_) {  // --sync local-sgd, diloco: every sync-every steps, the models meet
      const Phase phase = step_phase(*dist_.group, timeline_.get(), "synchronization", step_);
      diloco_->after_inner_step();
    }
    pass.count_step(reduced.first, reduced.second);
    const std::string line = config_.record_samples ? record_samples(pass, ids) : "";
    elastic_->reached(position_of(pass), line);  // --elastic: may re-form: a worker joins

    // Every check_params_every steps: are the ranks still training the same model?
    if (config_.check_params_every > 0 && step_ % config_.check_params_every == 0) {
      check_parameters();
    }
    timer_.exchange_if_due(step_);  // every --straggler-every steps: who is slow, and why
    if (stop_after_step(pass)) {    // --checkpoint-on-signal
      elastic_->settle();
      return false;
    }
  }
  elastic_->settle();  // --elastic: the last step's decision, before the epoch's collectives
  if (config_.uneven) {
    model_->finish_join();
    step_ += pass.steps - pass.step;  // the steps this rank joined: the same count everywhere
  }
  end_epoch(pass, m);
  return true;
}

std::optional<std::vector<data::Batch>> Trainer::step_batches(EpochPass& pass) {
  const auto timed = timer_.time(StepPhase::kData);
  // Its own label (the timeline's spans are next_batch's): a rank stalled in its loader is seen
  // there by the flight record.
  const Phase phase(*dist_.group, fmt::format("step {}: data", step_ + 1));
  std::vector<data::Batch> batches;
  while (static_cast<int64_t>(batches.size()) < config_.grad_accum_steps) {
    std::optional<data::Batch> batch = next_batch(pass);
    if (!batch) break;
    batches.push_back(std::move(*batch));
  }
  if (batches.empty()) return std::nullopt;
  return batches;
}

std::pair<torch::Tensor, int64_t> Trainer::step_gradients(EpochPass& pass,
                                                          const std::vector<data::Batch>& batches) {
  int64_t samples = 0;
  for (const auto& batch : batches) samples += batch.size();
  auto loss_sum = torch::zeros({}, torch::TensorOptions(torch::kDouble).device(dist_.device));
  for (size_t i = 0; i < batches.size(); ++i) {
    const bool last = i + 1 == batches.size();
    loss_sum += forward_backward(pass, batches[i], samples, /*sync=*/last && !diloco_);
  }
  if (diloco_) return {loss_sum, samples};  // nothing was reduced
  // Finalize, the reducer's at backward's end (it waited for every bucket and wrote the averages
  // into .grad): onto the timeline.
  const auto& reduced = model_->reducer().last_iteration();
  if (timeline_) record_reducer(*timeline_, reduced, step_ + 1);
  pass.grad_bytes += gradient_bytes(reduced);
  return {loss_sum, samples};
}

void Trainer::start_bucket_tuning() {
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

void Trainer::tune_buckets(double step_seconds) {
  if (!bucket_tuner_->record(step_seconds)) return;
  if (!bucket_tuner_->done()) {
    model_->set_bucket_cap_mb(bucket_tuner_->cap_mb());
    return;
  }
  const Phase phase = step_phase(*dist_.group, timeline_.get(), "bucket tuning", step_);
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

void Trainer::optimizer_step() {
  // Its collectives (the GradScaler's inf check, ZeRO's broadcasts) under a label of their own.
  const Phase phase(*dist_.group, fmt::format("step {}: optimizer", step_ + 1), timeline_.get(),
                    "optimizer step", "compute", step_ + 1);
  // --amp fp16: the true gradients first, and whether any rank has an inf or NaN in them.
  if (scaler_) scaler_->unscale_(*optimizer_);
  if (config_.clip_grad_norm > 0) {
    torch::nn::utils::clip_grad_norm_(workload_.module->parameters(), config_.clip_grad_norm);
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

torch::Tensor Trainer::forward_backward(EpochPass& pass, const data::Batch& batch,
                                        int64_t step_samples, bool sync) {
  const auto input = batch.input.to(dist_.device, /*non_blocking=*/pass.pin_memory);
  const auto target = batch.target.to(dist_.device, /*non_blocking=*/pass.pin_memory);
  Timeline* timeline = timeline_.get();
  // no_sync around forward and backward, as PyTorch's guard (Join's notice says it in forward).
  std::optional<DistributedDataParallelBase::NoSyncGuard> local;
  if (!sync) local.emplace(model_->reducer());
  torch::Tensor output, loss;
  {
    const Phase phase = step_phase(*dist_.group, timeline, "forward", step_ + 1);
    // --amp: the forward and the loss under autocast, the backward outside (PyTorch's recipe).
    std::optional<amp::Autocast> autocast;
    if (config_.amp != Amp::kOff)
      autocast.emplace(dist_.device.type(), autocast_dtype(config_.amp));
    output = model_->forward_with([&] { return workload_.forward(input); });
    loss = compute_loss(workload_.train_set.task, output, target);
  }
  if (std::exchange(pass.first, false)) log_shapes(input, output);

  // The mean over the step's samples: each micro-batch's mean loss weighted by its share, so
  // that micro-batches of B give the gradient of one batch of their total, a short last one too.
  const double share = static_cast<double>(batch.size()) / static_cast<double>(step_samples);
  {
    const Phase phase = step_phase(*dist_.group, timeline, "backward", step_ + 1);
    torch::Tensor weighted = share == 1.0 ? loss : loss * share;
    (scaler_ ? scaler_->scale(weighted) : weighted).backward();  // --amp fp16: scaled
  }
  return loss.detach().to(torch::kDouble) * static_cast<double>(batch.size());
}

int64_t Trainer::steps_for(int64_t samples) const {
  const int64_t batches = (samples + batch_size_ - 1) / batch_size_;
  return (batches + config_.grad_accum_steps - 1) / config_.grad_accum_steps;
}

torch::Tensor Trainer::epoch_sequence(int64_t epoch, int64_t world) const {
  data::DistributedSampler sampler(workload_.train_set.size(), world, /*rank=*/0,
                                   /*shuffle=*/true, static_cast<uint64_t>(config_.seed));
  sampler.set_epoch(epoch);  // here, so nobody can forget it
  return sampler.sequence(config_.uneven);
}

Trainer::EpochPass Trainer::begin_epoch(int64_t epoch) {
  const int64_t world = dist_.world_size();
  // A resumed epoch trains the rest its checkpoint left, shared by this world; the others their
  // sampler's sequence. --uneven: unpadded (ranks' shares differ by one at most); else padded to
  // the same size on every rank, the same number of steps.
  const bool resumed = epoch == start_epoch_ && start_epoch_samples_.defined();
  EpochPass pass;
  pass.sequence = resumed ? data::reshard(start_epoch_samples_, world, !config_.uneven)
                          : epoch_sequence(epoch, world);
  const torch::Tensor order = data::rank_share(pass.sequence, world, dist_.rank());
  const int64_t n = config_.drop_last ? order.size(0) / batch_size_ * batch_size_ : order.size(0);
  if (n == 0 && !resumed) {
    throw InputError(fmt::format("drop-last: each rank's {} samples are fewer than one batch of {}",
                                 order.size(0), batch_size_));
  }
  pass.epoch = epoch;
  // A resumed epoch goes on after the steps its checkpoint had taken.
  pass.first_step = resumed ? start_epoch_step_ : 0;
  pass.step = pass.first_step;
  // The steps of the rank with the most samples (rank 0's with --uneven): the learning-rate
  // schedule's epoch length, the same on every rank.
  const int64_t longest = config_.uneven ? (pass.sequence.size(0) + world - 1) / world : n;
  pass.steps = pass.first_step + steps_for(longest);
  workload_.module->train();
  pass.loss_sum = torch::zeros({}, torch::TensorOptions(torch::kDouble).device(dist_.device));
  pass.start = Clock::now();
  const data::LoaderOptions options = loader_options(epoch, pass.first_step);
  pass.pin_memory = options.pin_memory;
  pass.order = order.narrow(0, 0, n);
  pass.loader = std::make_unique<data::BatchLoader>(workload_.train_set, pass.order, options);
  pass.first = epoch == start_epoch_;
  pass.progress.emplace(progress_style_, config_.progress_every, epoch + 1, config_.epochs,
                        pass.steps, dist_.world_size());
  return pass;
}

std::optional<data::Batch> Trainer::next_batch(EpochPass& pass) {
  const Phase phase(*dist_.group, "", timeline_.get(), "data wait", "data", step_ + 1);
  return pass.loader->next();
}

bool Trainer::stop_after_step(const EpochPass& pass) {
  // A SIGTERM on any rank stops every rank after this same step; the epoch's last step goes on
  // to the epoch's end (see train()).
  if (pass.step == pass.steps || !stop_requested()) return false;
  save_checkpoint({pass.epoch, pass.step}, untrained_samples(pass));
  log::warn("stopped by SIGTERM after step {} ({} of epoch {}); --resume auto continues", step_,
            pass.step, pass.epoch + 1);
  return true;
}

void Trainer::end_epoch(EpochPass& pass, EpochMetrics& m) {
  elastic_->reached(position_of(pass));  // --elastic: the epoch's end, if what follows fails
  pass.progress->finish(pass.trained, [&] { return pass.running_loss(); });
  if (diloco_) {  // the epoch's evaluation, checkpoint and model.pt see the global model
    const Phase phase(*dist_.group, fmt::format("epoch {}: synchronization", m.epoch));
    diloco_->synchronize_if_pending();
  }
  const double seconds = seconds_since(pass.start);

  // Global figures: loss over all ranks' samples; throughput bounded by the slowest rank.
  const Phase phase(*dist_.group, fmt::format("epoch {}: training metrics", m.epoch));
  auto sums = torch::stack(
      {pass.loss_sum, torch::full({}, static_cast<double>(pass.trained), pass.loss_sum.options())});
  dist_.group->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  m.epoch_seconds =
      comm::all_reduce_scalar(*dist_.group, seconds, comm::ReduceOp::kMax, dist_.device);
  sums = sums.cpu();
  m.steps = step_;
  m.train_loss = sums[0].item<double>() / sums[1].item<double>();
  m.samples_per_s = sums[1].item<double>() / m.epoch_seconds;
  const int64_t trained_steps = pass.step - pass.first_step;
  m.grad_bytes_per_step =
      trained_steps > 0 ? static_cast<double>(pass.grad_bytes) / trained_steps : 0.0;
}

bool Trainer::stop_requested() {
  if (!config_.checkpoint_on_signal) return false;
  const Phase phase(*dist_.group, fmt::format("step {}: signal check", step_));
  return comm::any_rank(*dist_.group, g_stop_requested != 0, dist_.device);
}

void Trainer::check_parameters() {
  const Phase phase(*dist_.group, fmt::format("step {}: parameter check", step_));
  // Two float64 checksums per parameter (sum and sum of squares), gathered from every rank:
  // DDP keeps the parameters bitwise equal, so any difference is a divergence.
  const auto named = workload_.module->named_parameters();
  std::vector<torch::Tensor> sums;
  for (const auto& item : named) {
    const auto p = item.value().detach().to(torch::kDouble);
    sums.push_back(p.sum());
    sums.push_back(p.square().sum());
  }
  const at::Tensor rows = comm::all_gather_rows(*dist_.group, torch::stack(sums), dist_.device);
  if (comm::ranks_differing(rows, 0).empty()) return;
  const auto all = rows.view({dist_.world_size(), -1, 2});  // [rank, parameter, sum]
  const int64_t i = all.ne(all[0]).any(2).any(0).nonzero()[0][0].item<int64_t>();
  const std::vector<int64_t> ranks = comm::ranks_differing(all.select(1, i), 0);
  const int64_t first = ranks.front();
  throw Error(fmt::format(
      "parameters diverged across ranks by step {}: '{}' differs between rank 0 and rank(s) {} "
      "(sum {} on rank 0, {} on rank {}); the ranks no longer train the same model",
      step_, named[static_cast<size_t>(i)].key(), fmt::join(ranks, ", "),
      all[0][i][0].item<double>(), all[first][i][0].item<double>(), first));
}

data::LoaderOptions Trainer::loader_options(int64_t epoch, int64_t first_step) const {
  data::LoaderOptions o;
  o.batch_size = batch_size_;
  o.workers = static_cast<int>(config_.workers);
  o.pin_memory = config_.pin_memory && dist_.device.is_cuda();  // pinning needs CUDA
  if (config_.augment) {
    data::Augment augment;
    augment.pad_value = -data::kFashionMnistMean / data::kFashionMnistStd;  // black, normalised
    o.augment = augment;
  }
  o.seed = static_cast<uint64_t>(config_.seed);
  o.epoch = epoch;
  o.first_batch = first_step * config_.grad_accum_steps;
  o.rank = dist_.rank();
  return o;
}

void Trainer::log_shapes(const torch::Tensor& input, const torch::Tensor& output) {
  // One all_gather of fixed-size records: "input [15, 5] -> output [15, 2]" is far shorter.
  constexpr size_t kRecordBytes = 256;
  const auto shape = [](const torch::Tensor& t) {
    return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
  };
  const std::string mine = fmt::format("input {} -> output {}", shape(input), shape(output));
  const auto all = comm::all_gather_bytes(*dist_.group, mine, dist_.device, kRecordBytes);
  for (size_t r = 0; r < all.size(); ++r) log::info("rank {}: {}", r, all[r]);
}

Scores Trainer::evaluate(const data::TensorDataset& set) {
  const KeepCpuRng keep_rng;  // training's random numbers do not depend on evaluations
  model_->pre_forward();      // rank 0's buffers, as a forward through DDP would use
  torch::NoGradGuard no_grad;
  workload_.module->eval();
  // Unpadded shards: every sample counted once over all ranks. Ranks may run different numbers
  // of batches, so no collective inside this loop.
  const torch::Tensor order =
      data::evaluation_indices(set.size(), dist_.world_size(), dist_.rank());
  const int64_t n = order.size(0);
  const bool classification = set.task == data::Task::kClassification;
  // Sums of: loss, correct (classification) or absolute error, naive squared and absolute errors,
  // count.
  enum { kLoss, kCorrectOrAbs, kNaiveLoss, kNaiveAbs, kCount, kSums };
  auto sums = torch::zeros({kSums}, torch::TensorOptions(torch::kDouble).device(dist_.device));
  auto add = [&](int slot, const torch::Tensor& batch_sum) {
    sums[slot] += batch_sum.to(torch::kDouble);
  };
  for (int64_t begin = 0; begin < n; begin += batch_size_) {
    const int64_t size = std::min(batch_size_, n - begin);
    const data::Batch batch = set.gather(order.narrow(0, begin, size));
    const auto input = batch.input.to(dist_.device);
    const auto target = batch.target.to(dist_.device);
    const auto output = workload_.forward(input);
    add(kLoss, compute_loss(set.task, output, target) * static_cast<double>(size));
    if (classification) {
      add(kCorrectOrAbs, output.argmax(1).eq(target).sum());
    } else {  // per-sample means, as the loss
      add(kCorrectOrAbs, torch::l1_loss(output, target) * static_cast<double>(size));
    }
    if (workload_.naive) {
      const auto naive = workload_.naive(input);
      add(kNaiveLoss, torch::mse_loss(naive, target) * static_cast<double>(size));
      add(kNaiveAbs, torch::l1_loss(naive, target) * static_cast<double>(size));
    }
  }
  sums[kCount] += static_cast<double>(n);
  dist_.group->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  sums = sums.cpu() / sums[kCount].item<double>();
  const auto mean = [&](int slot) { return sums[slot].item<double>(); };
  Scores out;
  out.loss = mean(kLoss);
  (classification ? out.accuracy : out.mae) = mean(kCorrectOrAbs);
  if (workload_.naive) {
    out.naive_loss = mean(kNaiveLoss);
    out.naive_mae = mean(kNaiveAbs);
  }
  workload_.module->train();
  return out;
}

// Of the step in flight (not counted yet), before its vote: with --elastic a failure of this
// gather drops the step, so that every committed step has its record.
std::vector<std::string> Trainer::gather_sample_ids(const EpochPass& pass) {
  // The pass's loader takes this rank's order from its start, a step's batches at a time.
  const int64_t per_step = batch_size_ * config_.grad_accum_steps;
  const int64_t size = pass.order.size(0);
  const int64_t begin = std::min((pass.step - pass.first_step) * per_step, size);
  const at::Tensor ids = pass.order.narrow(0, begin, std::min(per_step, size - begin)).contiguous();
  const std::string mine(reinterpret_cast<const char*>(ids.data_ptr<int64_t>()),
                         static_cast<size_t>(ids.numel()) * sizeof(int64_t));
  return comm::all_gather_bytes(*dist_.group, mine, dist_.device);
}

std::string Trainer::record_samples(const EpochPass& pass, const std::vector<std::string>& all) {
  nlohmann::ordered_json line;
  line["epoch"] = pass.epoch + 1;
  line["step"] = step_;
  line["ids"] = nlohmann::ordered_json::array();
  for (const std::string& bytes : all) {
    std::vector<int64_t> rank_ids(bytes.size() / sizeof(int64_t));
    std::memcpy(rank_ids.data(), bytes.data(), rank_ids.size() * sizeof(int64_t));
    line["ids"].push_back(rank_ids);
  }
  std::string text = line.dump();
  if (!dist_.is_main()) return text;
  const std::string path = (std::filesystem::path(config_.output_dir) / "samples.jsonl").string();
  // A fresh run starts the file; a resumed run (cut to its checkpoint's step: write_run_files),
  // or a new rank 0 after an elastic change (completed by the heal), goes on.
  if (!samples_file_) {
    const bool fresh = step_ == 1 && dist_.launch.restart_count == 0 && !dist_.joining;
    samples_file_ = std::make_unique<std::ofstream>(path, fresh ? std::ios::trunc : std::ios::app);
  }
  *samples_file_ << text << '\n' << std::flush;
  if (!*samples_file_) throw Error(fmt::format("{}: cannot write the sample record", path));
  return text;
}

ElasticPosition Trainer::position_of(const EpochPass& pass) const {
  const int64_t per_rank = (pass.step - pass.first_step) * batch_size_ * config_.grad_accum_steps;
  return {pass.epoch, pass.step, pass.steps, pass.sequence,
          data::trained_prefix(pass.sequence.size(0), dist_.world_size(), per_rank)};
}

torch::Tensor Trainer::untrained_samples(const EpochPass& pass) const {
  return position_of(pass).rest();
}

void Trainer::release_group() {
  // The old generation's group goes with the DDP wrapper (whose reducer holds it and whose hooks
  // it removes), the watchdog and the GradScaler; the model, the optimizer and the data stay.
  watchdog_.reset();
  model_ = nullptr;
  if (scaler_) scaler_->set_group(nullptr);  // its inf check's collective, on the next group
  samples_file_.reset();  // rank 0 may be another worker next; the heal completes the record
}

void Trainer::adopt_group() {
  if (scaler_) scaler_->set_group(dist_.group);
  watchdog_ = start_watchdog(config_, dist_, comm::current_env());
  wrap_model(/*init_sync=*/false);  // Note [One state transfer per change]: the heal's is the one
  // Rank 0 may be another worker now: it goes on with the metrics file.
  if (!dist_.is_main()) {
    metrics_file_.reset();
  } else if (!metrics_file_) {
    metrics_file_.emplace((std::filesystem::path(config_.output_dir) / "metrics.jsonl").string(),
                          /*append=*/true);
  }
}

void Trainer::take_state(const Checkpoint& state, const std::string& origin) {
  batch_size_ = state.batch_size;
  apply(state, origin);
  batch_world_ = dist_.world_size();
  schedule_ = lr_schedule_of(config_, batch_size_, dist_.world_size());
}

ElasticPosition Trainer::state_position() const {
  return {start_epoch_, start_epoch_step_, start_epoch_step_, start_epoch_samples_, 0};
}

}  // namespace ddp::train
