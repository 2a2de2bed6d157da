#include "ddp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "cpu_rng.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/core/sync_batch_norm.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/data/loader.h"
#include "ddp/train/progress.h"
#include "ddp/train/state_dict.h"

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

}  // namespace

void request_stop_from_signal() {
  g_stop_requested = 1;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        const std::vector<torch::Tensor>& params) {
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(c.lr)
                                                           .momentum(c.momentum)
                                                           .nesterov(c.nesterov)
                                                           .weight_decay(c.weight_decay));
  }
  if (c.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  if (c.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  throw InputError(fmt::format("key 'optimizer': unknown optimizer '{}'", c.optimizer));
}

namespace {
// Checks everything a user can get wrong before any rank waits for the others.
Config prepared(Config config) {
  validate(config);
  if (config.nesterov && (config.optimizer != "sgd" || config.momentum <= 0.0)) {
    throw InputError("key 'nesterov': needs optimizer sgd with a momentum > 0");
  }
  make_writable_dir(config.output_dir);
  if (!config.timeline.empty()) {  // fail now, not after the whole run
    make_writable_dir(std::filesystem::absolute(config.timeline).parent_path().string());
  }
  return config;
}
}  // namespace

core::CommHook comm_hook_of(const std::string& name) {
  if (name == "fp16") return core::CommHook::kFp16Compress;
  if (name == "bf16") return core::CommHook::kBf16Compress;
  return core::CommHook::kAllReduce;
}

namespace {
// The step of a test hook on this rank: DDP_TEST_<name>_AT_STEP=N acts on rank
// DDP_TEST_<name>_RANK (default 0) after its N-th optimizer step, in the first run only
// (TORCHELASTIC_RESTART_COUNT unset or 0). 0: never. The hooks: CRASH kills the rank with
// SIGKILL (the launcher's restart test, the fault-injection tests); PERTURB changes its first
// parameter (the divergence check's test); SIGTERM sends the rank a SIGTERM
// (--checkpoint-on-signal).
int64_t test_hook_step(const comm::Env& env, int rank, const std::string& name) {
  auto get = [&](const std::string& key, const char* fallback) {
    auto it = env.find(key);
    return std::strtoll(it == env.end() ? fallback : it->second.c_str(), nullptr, 10);
  };
  if (get("TORCHELASTIC_RESTART_COUNT", "0") != 0 ||
      get("DDP_TEST_" + name + "_RANK", "0") != rank) {
    return 0;
  }
  return get("DDP_TEST_" + name + "_AT_STEP", "0");
}
}  // namespace

Trainer::Trainer(Config config)
    : config_(prepared(std::move(config))), dist_(init_distributed(config_, comm::current_env())) {
  const comm::Env env = comm::current_env();
  crash_at_step_ = test_hook_step(env, dist_.rank(), "CRASH");
  perturb_at_step_ = test_hook_step(env, dist_.rank(), "PERTURB");
  sigterm_at_step_ = test_hook_step(env, dist_.rank(), "SIGTERM");
  comm::WatchdogOptions watchdog;
  watchdog.stall_warning =
      std::chrono::milliseconds(static_cast<int64_t>(config_.stall_warning * 1000.0));
  watchdog.dump_path = (std::filesystem::path(config_.output_dir) / "debug" /
                        fmt::format("rank{}.json", dist_.rank()))
                           .string();
  if (auto dir = env.find("DDP_FLIGHT_DIR"); dir != env.end() && !dir->second.empty()) {
    watchdog.launcher_copy =
        (std::filesystem::path(dir->second) / fmt::format("rank{}.json", dist_.rank())).string();
  }
  dist_.group->start_watchdog(watchdog);
  if (!config_.timeline.empty()) timeline_ = std::make_unique<Timeline>();
  progress_style_ = progress_style(config_.progress, ::isatty(STDOUT_FILENO) != 0, dist_.is_main());
  // A group the launcher (or torchrun) restarted continues from its last checkpoint.
  auto restarts = env.find("TORCHELASTIC_RESTART_COUNT");
  if (config_.resume.empty() && restarts != env.end() && restarts->second != "0") {
    log::info("restart {} of the job: resuming from the newest checkpoint in '{}'",
              restarts->second, config_.output_dir);
    config_.resume = "auto";
  }
  if (config_.threads > 0) torch::set_num_threads(static_cast<int>(config_.threads));
  if (config_.global_batch_size > 0) {  // DataParallel's habit: one batch split over the ranks
    if (config_.global_batch_size % dist_.world_size() != 0) {
      throw InputError(
          fmt::format("key 'global-batch-size': {} samples cannot be split evenly over {} ranks",
                      config_.global_batch_size, dist_.world_size()));
    }
    config_.batch_size = config_.global_batch_size / dist_.world_size();
  }
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
  // Collective: checks the model is the same everywhere, broadcasts rank 0's weights.
  model_ = DistributedDataParallel(workload_.module, dist_.group,
                                   DistributedDataParallelOptions()
                                       .bucket_cap_mb(config_.bucket_cap_mb)
                                       .first_bucket_mb(config_.first_bucket_mb)
                                       .broadcast_buffers(config_.broadcast_buffers)
                                       .find_unused_parameters(config_.find_unused_parameters)
                                       .gradient_as_bucket_view(config_.gradient_as_bucket_view)
                                       .comm_hook(comm_hook_of(config_.comm_hook)));
  optimizer_ = make_optimizer(config_, workload_.module->parameters());
  const bool resumed = !config_.resume.empty() && resume();  // may change batch_size
  schedule_.kind = config_.lr_schedule;
  const int64_t global_batch = config_.batch_size * dist_.world_size();
  schedule_.base_lr =
      scaled_lr(config_.lr, config_.lr_scaling, global_batch, config_.reference_batch);
  if (config_.lr_scaling == "linear") {
    log::info("lr {} scaled linearly to {} for the global batch {} (reference batch {})",
              config_.lr, schedule_.base_lr, global_batch, config_.reference_batch);
  }
  schedule_.warmup_epochs = config_.warmup_epochs;
  schedule_.step_size = config_.lr_step_size;
  schedule_.gamma = config_.lr_gamma;
  schedule_.total_epochs = config_.epochs;
  if (dist_.is_main()) {
    const auto dir = std::filesystem::path(config_.output_dir);
    write_file_atomically((dir / "config.yaml").string(), to_yaml(config_));
    if (resumed) {  // the epochs after the checkpoint's are trained again
      const auto metrics = (dir / "metrics.jsonl").string();
      const std::string kept = std::filesystem::exists(metrics) ? read_file(metrics) : "";
      write_file_atomically(metrics, metrics_up_to(kept, start_epoch_));
    }
  }
}

TrainResult Trainer::run() {
  try {
    TrainResult result = train();
    if (timeline_) write_timeline(*dist_.group, dist_.device, *timeline_, config_.timeline);
    return result;
  } catch (const comm::CommError&) {
    // The evidence for the hang doctor: this rank's last collectives.
    const auto path = dist_.group->dump_flight_record("collective failed");
    if (!path.empty()) {
      log::error("rank {}: flight record written to {}; ddp_train --diagnose {} merges the ranks'",
                 dist_.rank(), path, config_.output_dir);
    }
    throw;
  }
}

TrainResult Trainer::train() {
  TrainResult result;
  result.metrics_path = (std::filesystem::path(config_.output_dir) / "metrics.jsonl").string();
  std::optional<MetricsWriter> metrics_file;  // rank 0 owns the files
  if (dist_.is_main()) metrics_file.emplace(result.metrics_path, /*append=*/start_epoch_ > 0);
  if (start_epoch_ >= config_.epochs) {
    log::info("the checkpoint is at epoch {} of {}: nothing left to train", start_epoch_,
              config_.epochs);
    return result;
  }
  log::info(
      "training {} on {} ({} train / {} test samples) on {} rank(s), {} threads each, batch {} "
      "per rank ({} global)",
      config_.model, config_.dataset, workload_.train_set.size(), workload_.test_set.size(),
      dist_.world_size(), torch::get_num_threads(), config_.batch_size,
      config_.batch_size * dist_.world_size());

  for (int64_t epoch = start_epoch_; epoch < config_.epochs; ++epoch) {
    EpochMetrics m;
    m.epoch = epoch + 1;
    if (!train_epoch(epoch, m)) {
      result.stopped_by_signal = true;
      return result;
    }

    // Evaluate every eval_every epochs, and always after the last one (all ranks): the validation
    // split when there is one, and then the test split after the last epoch only.
    const bool last = epoch + 1 == config_.epochs;
    const bool periodic = last || (config_.eval_every > 0 && (epoch + 1) % config_.eval_every == 0);
    if (periodic) {
      const Timeline::Scope span(timeline_.get(), "evaluation", "compute");
      dist_.group->set_phase(fmt::format("epoch {}: evaluation", m.epoch));
      if (workload_.val_set) m.val = evaluate(*workload_.val_set);
      if (last || !workload_.val_set) m.test = evaluate(workload_.test_set);
    }

    // Log and record the epoch (rank 0).
    log::info("epoch {}/{}: {}, {:.0f} samples/s, {:.2f} s, lr {:.4g}", m.epoch, config_.epochs,
              describe(m), m.samples_per_s, m.epoch_seconds, m.lr);
    if (metrics_file) metrics_file->write(m);
    result.epochs.push_back(m);

    // Checkpoint every save_every epochs and after the last one (all ranks; rank 0 writes).
    const bool save = last || (config_.save_every > 0 && (epoch + 1) % config_.save_every == 0);
    if (save) {
      const Timeline::Scope span(timeline_.get(), "checkpoint", "io");
      dist_.group->set_phase(fmt::format("epoch {}: checkpoint", m.epoch));
      save_checkpoint({epoch + 1, 0});
    }

    // A SIGTERM during the evaluation or the checkpoint stops the run here (all ranks).
    if (!last && stop_requested()) {
      if (!save) save_checkpoint({epoch + 1, 0});
      log::warn("stopped by SIGTERM after epoch {}; --resume auto continues", m.epoch);
      result.stopped_by_signal = true;
      return result;
    }
  }

  const EpochMetrics& final = result.epochs.back();
  log::info("done: {} epochs, {}, {:.0f} samples/s; metrics in {}", config_.epochs, describe(final),
            final.samples_per_s, result.metrics_path);
  return result;
}

bool Trainer::train_epoch(int64_t epoch, EpochMetrics& m) {
  const auto& train_set = workload_.train_set;
  data::DistributedSampler sampler(train_set.size(), dist_.world_size(), dist_.rank(),
                                   /*shuffle=*/true, static_cast<uint64_t>(config_.seed));
  sampler.set_epoch(epoch);  // here, so nobody can forget it
  const torch::Tensor order = sampler.indices();
  // The same on every rank: the same number of steps.
  const int64_t n =
      config_.drop_last ? order.size(0) / config_.batch_size * config_.batch_size : order.size(0);
  if (n == 0) {
    throw InputError(fmt::format("drop-last: each rank's {} samples are fewer than one batch of {}",
                                 order.size(0), config_.batch_size));
  }
  const int64_t steps_per_epoch = (n + config_.batch_size - 1) / config_.batch_size;

  workload_.module->train();
  // On the device, so the loop never waits for it.
  auto loss_sum = torch::zeros({}, torch::TensorOptions(torch::kDouble).device(dist_.device));
  const auto start = Clock::now();
  const data::LoaderOptions options = loader_options(epoch);
  data::BatchLoader loader(train_set, order.narrow(0, 0, n), options);
  bool first = epoch == start_epoch_;
  // A checkpoint written on SIGTERM resumes after the steps it had taken of this epoch: the
  // loader gives the same batches, and the first ones are passed over.
  int64_t skip = epoch == start_epoch_ ? start_epoch_step_ : 0;
  int64_t epoch_step = skip;
  int64_t trained = 0;                   // samples
  Timeline* timeline = timeline_.get();  // nullptr: no --timeline
  EpochProgress progress(progress_style_, config_.progress_every, epoch + 1, config_.epochs,
                         steps_per_epoch, dist_.world_size());
  const auto running_loss = [&] {  // rank 0's shard only: no collective for a progress line
    return trained > 0 ? loss_sum.item<double>() / static_cast<double>(trained) : 0.0;
  };
  while (true) {
    std::optional<data::Batch> batch;
    {
      const Timeline::Scope span(timeline, "data wait", "data", step_ + 1);
      batch = loader.next();
    }
    if (!batch) break;
    if (skip > 0) {
      --skip;
      continue;
    }
    // Next batch (pinned batches are copied while the GPU works).
    const int64_t size = batch->size();
    auto input = batch->input.to(dist_.device, /*non_blocking=*/options.pin_memory);
    auto target = batch->target.to(dist_.device, /*non_blocking=*/options.pin_memory);

    // Forward, loss, backward (buckets all-reduced as their gradients arrive), step.
    m.lr = lr_at(schedule_, step_, steps_per_epoch);
    set_lr(*optimizer_, m.lr);
    model_->zero_grad();  // dropped: the next backward's gradients become .grad (see the header)
    torch::Tensor output, loss;
    {
      const Timeline::Scope span(timeline, "forward", "compute", step_ + 1);
      dist_.group->set_phase(fmt::format("step {}: forward", step_ + 1));
      output = model_->forward_with([&] { return workload_.forward(input); });
      loss = compute_loss(train_set.task, output, target);
    }
    if (first) log_shapes(input, output);
    first = false;
    {
      const Timeline::Scope span(timeline, "backward", "compute", step_ + 1);
      dist_.group->set_phase(fmt::format("step {}: backward", step_ + 1));
      loss.backward();
    }
    if (timeline) record_reducer(*timeline, model_->reducer().last_iteration(), step_ + 1);
    {
      const Timeline::Scope span(timeline, "optimizer step", "compute", step_ + 1);
      optimizer_->step();
    }
    ++step_;
    if (step_ == crash_at_step_) {  // test hooks, see above
      log::warn("rank {}: test hook: SIGKILL at step {}", dist_.rank(), step_);
      spdlog::default_logger()->flush();
      ::kill(::getpid(), SIGKILL);
    }
    if (step_ == sigterm_at_step_) ::kill(::getpid(), SIGTERM);
    if (step_ == perturb_at_step_) {
      torch::NoGradGuard no_grad;
      workload_.module->parameters().front().add_(1e-3);
    }

    // Every check_params_every steps: are the ranks still training the same model?
    if (config_.check_params_every > 0 && step_ % config_.check_params_every == 0) {
      check_parameters();
    }

    loss_sum += loss.detach().to(torch::kDouble) * static_cast<double>(size);
    trained += size;
    progress.update(++epoch_step, trained, running_loss);

    // --checkpoint-on-signal: a SIGTERM on any rank stops every rank after this same step (the
    // epoch's last step goes on to the epoch's end: see train()).
    if (epoch_step < steps_per_epoch && stop_requested()) {
      save_checkpoint({epoch, epoch_step});
      log::warn("stopped by SIGTERM after step {} ({} of epoch {}); --resume auto continues", step_,
                epoch_step, epoch + 1);
      return false;
    }
  }
  progress.finish(trained, running_loss);
  const double seconds = seconds_since(start);

  // Global figures: loss over all ranks' samples; throughput bounded by the slowest rank.
  dist_.group->set_phase(fmt::format("epoch {}: training metrics", m.epoch));
  auto sums =
      torch::stack({loss_sum, torch::full({}, static_cast<double>(trained), loss_sum.options())});
  dist_.group->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  auto slowest = torch::full({1}, seconds, loss_sum.options());
  dist_.group->all_reduce(slowest, comm::ReduceOp::kMax)->wait();
  sums = sums.cpu();
  m.epoch_seconds = slowest.cpu().item<double>();
  m.steps = step_;
  m.train_loss = sums[0].item<double>() / sums[1].item<double>();
  m.samples_per_s = sums[1].item<double>() / m.epoch_seconds;
  return true;
}

bool Trainer::stop_requested() {
  if (!config_.checkpoint_on_signal) return false;
  dist_.group->set_phase(fmt::format("step {}: signal check", step_));
  auto stop = torch::full({1}, g_stop_requested != 0 ? 1 : 0,
                          torch::TensorOptions(torch::kInt).device(dist_.device));
  dist_.group->all_reduce(stop, comm::ReduceOp::kMax)->wait();
  return stop.cpu().item<int>() != 0;
}

void Trainer::check_parameters() {
  dist_.group->set_phase(fmt::format("step {}: parameter check", step_));
  // Two float64 checksums per parameter (sum and sum of squares), gathered from every rank:
  // DDP keeps the parameters bitwise equal, so any difference is a divergence.
  const auto named = workload_.module->named_parameters();
  std::vector<torch::Tensor> sums;
  for (const auto& item : named) {
    const auto p = item.value().detach().to(torch::kDouble);
    sums.push_back(p.sum());
    sums.push_back(p.square().sum());
  }
  const auto mine = torch::stack(sums);
  auto all = torch::empty({dist_.world_size() * mine.numel()}, mine.options());
  dist_.group->all_gather(all, mine)->wait();
  all = all.cpu().view({dist_.world_size(), -1, 2});
  const auto differs = all.ne(all[0]).any(2);  // [rank, parameter]
  const auto diverged = differs.any(0).nonzero();
  if (diverged.numel() == 0) return;
  const int64_t i = diverged[0][0].item<int64_t>();
  const auto ranks = differs.select(1, i).nonzero().view({-1});
  const int64_t first = ranks[0].item<int64_t>();
  throw Error(fmt::format(
      "parameters diverged across ranks by step {}: '{}' differs between rank 0 and rank(s) {} "
      "(sum {} on rank 0, {} on rank {}); the ranks no longer train the same model",
      step_, named[static_cast<size_t>(i)].key(),
      fmt::join(ranks.data_ptr<int64_t>(), ranks.data_ptr<int64_t>() + ranks.numel(), ", "),
      all[0][i][0].item<double>(), all[first][i][0].item<double>(), first));
}

data::LoaderOptions Trainer::loader_options(int64_t epoch) const {
  data::LoaderOptions o;
  o.batch_size = config_.batch_size;
  o.workers = static_cast<int>(config_.workers);
  o.pin_memory = config_.pin_memory && dist_.device.is_cuda();  // pinning needs CUDA
  if (config_.augment) {
    data::Augment augment;
    augment.pad_value = -data::kFashionMnistMean / data::kFashionMnistStd;  // black, normalised
    o.augment = augment;
  }
  o.seed = static_cast<uint64_t>(config_.seed);
  o.epoch = epoch;
  o.rank = dist_.rank();
  return o;
}

void Trainer::log_shapes(const torch::Tensor& input, const torch::Tensor& output) {
  // Fixed-size records so that one all_gather collects them: [rank dims of input, of output].
  constexpr int64_t kDims = 6;
  auto record = torch::full({2 * (kDims + 1)}, -1, torch::kLong);
  for (const auto& [slot, t] : {std::pair{0, input}, std::pair{1, output}}) {
    const int64_t base = slot * (kDims + 1);
    record[base] = std::min<int64_t>(t.dim(), kDims);
    for (int64_t d = 0; d < std::min<int64_t>(t.dim(), kDims); ++d)
      record[base + 1 + d] = t.size(d);
  }
  auto all =
      torch::empty({dist_.world_size() * record.numel()}, record.options().device(dist_.device));
  dist_.group->all_gather(all, record.to(dist_.device))->wait();
  all = all.cpu().view({dist_.world_size(), 2, kDims + 1});
  auto shape = [&](int64_t rank, int64_t slot) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < all[rank][slot][0].item<int64_t>(); ++d) {
      dims.push_back(all[rank][slot][1 + d].item<int64_t>());
    }
    return fmt::format("[{}]", fmt::join(dims, ", "));
  };
  for (int64_t r = 0; r < dist_.world_size(); ++r) {
    log::info("rank {}: input {} -> output {}", r, shape(r, 0), shape(r, 1));
  }
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
  for (int64_t begin = 0; begin < n; begin += config_.batch_size) {
    const int64_t size = std::min(config_.batch_size, n - begin);
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

}  // namespace ddp::train
