#include "ddp/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>

#include "cpu_rng.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/core/autocast.h"
#include "ddp/core/sync_batch_norm.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/data/loader.h"
#include "ddp/train/progress.h"
#include "ddp/train/state_dict.h"
#include "epoch_pass.h"
#include "parallel_mode.h"
#include "phase.h"
#include "sample_record.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// Set by request_stop_from_signal() (a signal handler); read once per step by stop_requested().
volatile sig_atomic_t g_stop_requested = 0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Creates `dir` (and its parents) and checks that this process can write there.
void make_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("output dir '{}': cannot create it: {}", dir, ec.message()));
  check_writable_dir(dir);
}

}  // namespace

void request_stop_from_signal() {
  g_stop_requested = 1;
}

namespace {

// Checks everything a user can get wrong before any rank waits for the others.
Config prepared(Config config) {
  validate(config);
  config.parallel = parallel_mode(config);  // what the older keys name, once
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
  make_writable_dir(config.output_dir);
  if (!config.timeline.empty()) {  // fail now, not after the whole run
    make_writable_dir(std::filesystem::absolute(config.timeline).parent_path().string());
  }
  return config;
}

// Intra-op threads: --threads, else LibTorch's default unless this host's ranks share cores.
void set_threads(const Config& config, const Distributed& dist) {
  const int threads = threads_for_this_process(static_cast<int>(config.threads),
                                               comm::current_env(), dist.launch.local_world_size);
  if (threads <= 0) return;
  if (config.threads == 0 && dist.is_main()) {
    log::info(
        "intra-op threads per rank: {} of LibTorch's {}, so that this host's {} rank(s) "
        "do not share cores (--threads or OMP_NUM_THREADS choose otherwise)",
        threads, torch::get_num_threads(), dist.launch.local_world_size);
  }
  set_intra_op_threads(threads);
}

// The workload made here (--sync-bn: its layers on the group, which an elastic joiner, refused
// --sync-bn, has not yet), or the one a warm spare made before it forked this worker.
Workload made_workload(const Config& config, const Distributed& dist,
                       std::optional<Workload> preloaded) {
  if (preloaded) return std::move(*preloaded);
  models::NormFactory norm;
  if (config.sync_bn) {
    norm = [group = dist.group](int64_t channels) {
      return torch::nn::AnyModule(SyncBatchNorm(channels, group));
    };
  }
  return make_workload(config, norm);
}

// The workload on this rank's device, with --init-weights.
Workload build_workload(const Config& config, const Distributed& dist,
                        std::optional<Workload> preloaded) {
  Workload workload = made_workload(config, dist, std::move(preloaded));
  // A joiner has no group yet; the launch's world size is the most the group can have.
  const int world = dist.group ? dist.world_size() : dist.launch.world_size;
  if (workload.train_set.size() < world) {
    throw InputError(fmt::format("{} training samples cannot be shared by {} ranks",
                                 workload.train_set.size(), world));
  }
  workload.module->to(dist.device);
  if (!config.init_weights.empty()) {
    load_weights(*workload.module, config.init_weights);
    log::info("initial weights from {}", config.init_weights);
  }
  return workload;
}

// The DataParallel tutorial's printout, for the run's first step: the part of the global batch
// each rank saw ("rank 1: input [15, 5] -> output [15, 2]"). A collective.
void log_shapes(const Distributed& dist, const torch::Tensor& input, const torch::Tensor& output) {
  // One all_gather of fixed-size records: "input [15, 5] -> output [15, 2]" is far shorter.
  constexpr size_t kRecordBytes = 256;
  const auto shape = [](const torch::Tensor& t) {
    return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
  };
  const std::string mine = fmt::format("input {} -> output {}", shape(input), shape(output));
  const auto all = comm::all_gather_bytes(*dist.group, mine, dist.device, kRecordBytes);
  for (size_t r = 0; r < all.size(); ++r) log::info("rank {}: {}", r, all[r]);
}

// --check-params-every: compares checksums of the parameters across ranks (a collective);
// throws Error naming the first parameter that differs and the ranks where it does.
void check_parameters(const torch::nn::Module& module, const Distributed& dist, int64_t step) {
  const Phase phase(*dist.group, fmt::format("step {}: parameter check", step));
  // Two float64 checksums per parameter (sum and sum of squares), gathered from every rank:
  // The ranks keep the parameters bitwise equal, so any difference is a divergence.
  const auto named = module.named_parameters();
  std::vector<torch::Tensor> sums;
  for (const auto& item : named) {
    const auto p = item.value().detach().to(torch::kDouble);
    sums.push_back(p.sum());
    sums.push_back(p.square().sum());
  }
  const at::Tensor rows = comm::all_gather_rows(*dist.group, torch::stack(sums), dist.device);
  if (comm::ranks_differing(rows, 0).empty()) return;
  const auto all = rows.view({dist.world_size(), -1, 2});  // [rank, parameter, sum]
  const int64_t i = all.ne(all[0]).any(2).any(0).nonzero()[0][0].item<int64_t>();
  const std::vector<int64_t> ranks = comm::ranks_differing(all.select(1, i), 0);
  const int64_t first = ranks.front();
  throw Error(fmt::format(
      "parameters diverged across ranks by step {}: '{}' differs between rank 0 and rank(s) {} "
      "(sum {} on rank 0, {} on rank {}); the ranks no longer train the same model",
      step, named[static_cast<size_t>(i)].key(), fmt::join(ranks, ", "),
      all[0][i][0].item<double>(), all[first][i][0].item<double>(), first));
}

// Where an evaluation forward is a collective (the mode's), a rank with fewer than the most
// batches of any rank runs forwards of one sample until it has run as many (a collective first).
void match_evaluation_forwards(ParallelMode& mode, const data::TensorDataset& set, int64_t batches,
                               const torch::Device& device) {
  const int64_t forwards = mode.evaluation_forwards(batches);
  for (int64_t extra = batches; extra < forwards; ++extra) {
    mode.evaluation_forward(set.gather(torch::zeros({1}, torch::kLong)).input.to(device));
  }
}

}  // namespace

Trainer::Trainer(Config config) : Trainer(std::move(config), Distributed{}) {}

Trainer::Trainer(Config config, Distributed dist, std::optional<Workload> preloaded)
    : config_(prepared(std::move(config))),
      dist_(dist.group || dist.agent ? std::move(dist)
                                     : init_distributed(config_, comm::current_env())),
      timeline_(config_.timeline.empty() ? nullptr : std::make_unique<Timeline>()),
      timer_(dist_, {config_.straggler_threshold, config_.straggler_every, config_.uneven},
             timeline_.get()) {
  const bool joiner = dist_.agent != nullptr && dist_.joining;
  set_threads(config_, dist_);
  workload_ = build_workload(config_, dist_, std::move(preloaded));
  if (joiner) join_running_group(dist_);  // Note [A joiner is ready once its own work is done]
  progress_style_ =
      progress_style(config_.progress, ::isatty(STDOUT_FILENO) != 0,
                     dist_.launch.launcher == comm::Launcher::kMpirun, dist_.is_main());
  // A group the launcher (or torchrun) restarted continues from its last checkpoint; an elastic
  // worker that joins a running group takes its state instead.
  if (config_.resume.empty() && dist_.launch.restart_count != 0 && !joiner) {
    log::info("restart {} of the job: resuming from the newest checkpoint in '{}'",
              dist_.launch.restart_count, config_.output_dir);
    config_.resume = "auto";
  }
  state_ = std::make_unique<TrainState>(config_, dist_, workload_, timeline_.get());
  elastic_ = std::make_unique<ElasticMember>(
      dist_, *state_, timeline_.get(),
      ElasticMember::Options{config_.output_dir, config_.record_samples, config_.log_level,
                             config_.stall_warning});
  bool resumed = false;
  if (joiner) {
    state_->build(/*init_sync=*/false);  // the group's state comes whole when it joins (run())
  } else if (!elastic_->attempt([&] {
               state_->build(/*init_sync=*/true);
               resumed = state_->resume();  // may change the batch size
             })) {
    resumed = state_->step() > 0;  // --elastic: re-formed meanwhile, and healed
  }
  state_->set_schedule();
  if (dist_.is_main()) write_run_files(resumed);
}

Trainer::~Trainer() = default;

void Trainer::write_run_files(bool resumed) const {
  const auto dir = std::filesystem::path(config_.output_dir);
  write_file_atomically((dir / "config.yaml").string(), to_yaml(config_));
  if (!resumed) return;
  // The epochs and steps after the checkpoint's are trained again: the records say what the
  // model now holds, each epoch and step once.
  const auto metrics = (dir / "metrics.jsonl").string();
  const std::string kept = std::filesystem::exists(metrics) ? read_file(metrics) : "";
  write_file_atomically(metrics, metrics_up_to(kept, state_->position().epoch));
  const auto samples = (dir / "samples.jsonl").string();
  if (config_.record_samples && std::filesystem::exists(samples)) {
    write_file_atomically(samples, records_up_to(read_file(samples), "step", state_->step()));
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
    const auto path = elastic_->dump_flight_record("collective failed");
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
  const int64_t start_epoch = state_->position().epoch;
  // Rank 0 owns the files; a joiner that is rank 0 after a change goes on with them.
  if (dist_.is_main() && !metrics_file_)
    metrics_file_.emplace(result.metrics_path, /*append=*/start_epoch > 0 || dist_.joining);
  if (start_epoch >= config_.epochs) {
    log::info("the checkpoint is at epoch {} of {}: nothing left to train", start_epoch,
              config_.epochs);
    elastic_->done_training();
    return result;
  }
  const int64_t global = state_->batch_size() * dist_.world_size() * config_.grad_accum_steps;
  log::info(
      "training {} on {} ({} train / {} test samples) on {} rank(s), {} threads each, batch {} "
      "per rank{} ({} global)",
      config_.model, config_.dataset, workload_.train_set.size(), workload_.test_set.size(),
      dist_.world_size(), torch::get_num_threads(), state_->batch_size(),
      config_.grad_accum_steps > 1
          ? fmt::format(" x {} accumulated micro-batches", config_.grad_accum_steps)
          : "",
      global);

  state_->mode().begin_training();
  for (int64_t epoch = start_epoch; epoch < config_.epochs;) {
    EpochMetrics m;
    m.epoch = epoch + 1;
    // --elastic: a change of the group's members ends the attempt; the group re-forms and every
    // member takes one state (elastic_member.h).
    const bool kept = elastic_->attempt(
        [&] { result.stopped_by_signal = !train_epoch(epoch, m) || end_of_epoch(m, result); });
    if (result.stopped_by_signal) {
      state_->finish_saving();
      return result;
    }
    epoch = kept ? epoch + 1 : state_->position().epoch;  // re-formed: where the state taken is
  }
  state_->finish_saving();
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
  if (last) timer_.exchange_rest(state_->step());

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
    write_metrics(m);
    result.epochs.push_back(m);
  }

  // Checkpoint every save_every epochs and after the last one (all ranks; rank 0 writes).
  const bool saved = last || (config_.save_every > 0 && m.epoch % config_.save_every == 0);
  if (saved) {
    const Phase phase(*dist_.group, fmt::format("epoch {}: checkpoint", m.epoch), timeline_.get(),
                      "checkpoint", "io");
    save({m.epoch, 0});
  }

  // A SIGTERM during the evaluation or the checkpoint stops the run here (all ranks).
  return !last && stop_after_epoch(m.epoch, saved);
}

void Trainer::evaluate_epoch(EpochMetrics& m, bool last) {
  const Phase phase(*dist_.group, fmt::format("epoch {}: evaluation", m.epoch), timeline_.get(),
                    "evaluation", "compute");
  if (workload_.val_set) m.val = evaluate(*workload_.val_set);
  if (last || !workload_.val_set) m.test = evaluate(workload_.test_set);
}

void Trainer::write_metrics(const EpochMetrics& m) {
  // Rank 0 may be another worker after an elastic change: it goes on with the file.
  if (!dist_.is_main()) {
    metrics_file_.reset();
    return;
  }
  if (!metrics_file_)
    metrics_file_.emplace((std::filesystem::path(config_.output_dir) / "metrics.jsonl").string(),
                          /*append=*/true);
  metrics_file_->write(m);
}

void Trainer::save(CheckpointPosition at, const torch::Tensor& untrained) {
  elastic_->checkpoint_saved(state_->save(at, untrained));
}

bool Trainer::stop_after_epoch(int64_t epoch, bool saved) {
  if (!stop_requested()) return false;
  if (!saved) save({epoch, 0});
  log::warn("stopped by SIGTERM after epoch {}; --resume auto continues", epoch);
  return true;
}

bool Trainer::train_epoch(int64_t epoch, EpochMetrics& m) {
  EpochPass pass = begin_epoch(config_, dist_, workload_, *state_, progress_style_, epoch);
  // --elastic: a failure from here goes on from here.
  elastic_->reached(pass.position(dist_.world_size()));
  return train_steps(pass, m);
}

bool Trainer::train_steps(EpochPass& pass, EpochMetrics& m) {
  // --uneven: a rank out of batches joins the others' steps until all are done (core/join.h).
  if (config_.uneven) state_->mode().begin_join();
  while (true) {
    const std::optional<std::vector<data::Batch>> batches = step_batches(pass);
    if (!batches) break;
    const auto step_start = Clock::now();
    m.lr = lr_at(state_->schedule(), state_->step(), pass.steps);
    state_->set_lr(m.lr);
    state_->mode().zero_grad();  // dropped: the next backward's gradients become .grad

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
      if (config_.record_samples) ids = gather_sample_ids(dist_, pass.step_ids());
    });
    {
      const auto timed = timer_.time(StepPhase::kOptimizer);
      state_->optimizer_step();  // on the reduced gradients, the same on every rank
    }
    timer_.count_step();
    state_->count_step(seconds_since(step_start));  // and --bucket-cap-mb auto, --sync's meeting
    pass.count_step(reduced.first, reduced.second);
    const std::string line = record_samples(config_, dist_, pass.epoch + 1, state_->step(), ids);
    // --elastic: may re-form (a worker joins).
    elastic_->reached(pass.position(dist_.world_size()), line);
    if (after_step(pass)) {  // --checkpoint-on-signal
      elastic_->settle();
      return false;
    }
  }
  elastic_->settle();  // --elastic: the last step's decision, before the epoch's collectives
  if (config_.uneven) {
    state_->mode().finish_join();
    state_->skip_steps(pass.steps - pass.step);  // the steps this rank joined: the same count
  }
  end_epoch(pass, m);
  return true;
}

bool Trainer::after_step(const EpochPass& pass) {
  // Every check_params_every steps: are the ranks still training the same model?
  const int64_t step = state_->step();
  if (config_.check_params_every > 0 && step % config_.check_params_every == 0) {
    check_parameters(*workload_.module, dist_, step);
  }
  timer_.exchange_if_due(step);  // every --straggler-every steps: who is slow, and why
  return stop_after_step(pass);
}

std::optional<std::vector<data::Batch>> Trainer::step_batches(EpochPass& pass) {
  const auto timed = timer_.time(StepPhase::kData);
  const int64_t step = state_->step() + 1;
  // Its own label (the timeline's spans are each batch's): a rank stalled in its loader is seen
  // there by the flight record.
  const Phase phase(*dist_.group, fmt::format("step {}: data", step));
  const auto next_batch = [&] {  // a span of the timeline each
    const Phase wait(*dist_.group, "", timeline_.get(), "data wait", "data", step);
    return pass.loader->next();
  };
  std::vector<data::Batch> batches;
  while (static_cast<int64_t>(batches.size()) < config_.grad_accum_steps) {
    std::optional<data::Batch> batch = next_batch();
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
    loss_sum += forward_backward(pass, batches[i], samples, /*last=*/i + 1 == batches.size());
  }
  // The reduction's spans onto the timeline, and the bytes it carried.
  pass.grad_bytes += state_->mode().record_reduction(timeline_.get(), state_->step() + 1);
  return {loss_sum, samples};
}

torch::Tensor Trainer::forward_backward(EpochPass& pass, const data::Batch& batch,
                                        int64_t step_samples, bool last) {
  const auto input = batch.input.to(dist_.device, /*non_blocking=*/pass.pin_memory);
  const auto target = batch.target.to(dist_.device, /*non_blocking=*/pass.pin_memory);
  Timeline* timeline = timeline_.get();
  const int64_t step = state_->step() + 1;
  // Gradients kept on this rank, added up, but in the step's last micro-batch (the mode's).
  const std::unique_ptr<Accumulation> accumulation = state_->mode().accumulate(last);
  torch::Tensor output, loss;
  {
    const Phase phase = step_phase(*dist_.group, timeline, "forward", step);
    // --amp: the forward and the loss under autocast, the backward outside (PyTorch's recipe).
    std::optional<amp::Autocast> autocast;
    if (config_.amp != Amp::kOff)
      autocast.emplace(dist_.device.type(), autocast_dtype(config_.amp));
    output = state_->mode().forward(input);
    loss = compute_loss(workload_.train_set.task, output, target);
  }
  if (std::exchange(pass.first, false)) log_shapes(dist_, input, output);

  // The mean over the step's samples: each micro-batch's mean loss weighted by its share, so
  // that micro-batches of B give the gradient of one batch of their total, a short last one too.
  const double share = static_cast<double>(batch.size()) / static_cast<double>(step_samples);
  {
    const Phase phase = step_phase(*dist_.group, timeline, "backward", step);
    torch::Tensor weighted = share == 1.0 ? loss : loss * share;
    amp::GradScaler* scaler = state_->scaler();
    state_->mode().backward(scaler ? scaler->scale(weighted) : weighted);  // --amp fp16: scaled
  }
  return loss.detach().to(torch::kDouble) * static_cast<double>(batch.size());
}

bool Trainer::stop_after_step(const EpochPass& pass) {
  // A SIGTERM on any rank stops every rank after this same step; the epoch's last step goes on
  // to the epoch's end (see train()).
  if (pass.step == pass.steps || !stop_requested()) return false;
  save({pass.epoch, pass.step}, pass.position(dist_.world_size()).rest());
  log::warn("stopped by SIGTERM after step {} ({} of epoch {}); --resume auto continues",
            state_->step(), pass.step, pass.epoch + 1);
  return true;
}

void Trainer::end_epoch(EpochPass& pass, EpochMetrics& m) {
  elastic_->reached(
      pass.position(dist_.world_size()));  // --elastic: the epoch's end, if what follows fails
  pass.progress->finish(pass.trained, [&] { return pass.running_loss(); });
  state_->mode().end_epoch(m.epoch);
  const double seconds = seconds_since(pass.start);

  // Global figures: loss over all ranks' samples; throughput bounded by the slowest rank.
  const Phase phase(*dist_.group, fmt::format("epoch {}: training metrics", m.epoch));
  auto sums = torch::stack(
      {pass.loss_sum, torch::full({}, static_cast<double>(pass.trained), pass.loss_sum.options())});
  dist_.group->all_reduce(sums, comm::ReduceOp::kSum)->wait();
  m.epoch_seconds =
      comm::all_reduce_scalar(*dist_.group, seconds, comm::ReduceOp::kMax, dist_.device);
  sums = sums.cpu();
  m.steps = state_->step();
  m.train_loss = sums[0].item<double>() / sums[1].item<double>();
  m.samples_per_s = sums[1].item<double>() / m.epoch_seconds;
  const int64_t trained_steps = pass.step - pass.first_step;
  m.grad_bytes_per_step =
      trained_steps > 0 ? static_cast<double>(pass.grad_bytes) / trained_steps : 0.0;
}

bool Trainer::stop_requested() {
  if (!config_.checkpoint_on_signal) return false;
  const Phase phase(*dist_.group, fmt::format("step {}: signal check", state_->step()));
  return comm::any_rank(*dist_.group, g_stop_requested != 0, dist_.device);
}

Scores Trainer::evaluate(const data::TensorDataset& set) {
  const KeepCpuRng keep_rng;  // training's random numbers do not depend on evaluations
  ParallelMode& mode = state_->mode();
  mode.before_evaluation();  // rank 0's buffers (broadcast-buffers)
  torch::NoGradGuard no_grad;
  workload_.module->eval();
  // Unpadded parts (every sample once); the loop's one collective: a mode's forward, if any.
  const torch::Tensor order =
      data::evaluation_indices(set.size(), dist_.world_size(), dist_.rank());
  const int64_t n = order.size(0);
  const int64_t batch_size = state_->batch_size();
  match_evaluation_forwards(mode, set, (n + batch_size - 1) / batch_size, dist_.device);
  const bool classification = set.task == data::Task::kClassification;
  // Sums of: loss, correct (classification) or absolute error, naive squared and absolute errors,
  // count.
  enum { kLoss, kCorrectOrAbs, kNaiveLoss, kNaiveAbs, kCount, kSums };
  auto sums = torch::zeros({kSums}, torch::TensorOptions(torch::kDouble).device(dist_.device));
  auto add = [&](int slot, const torch::Tensor& sum) { sums[slot] += sum.to(torch::kDouble); };
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t size = std::min(batch_size, n - begin);
    const data::Batch batch = set.gather(order.narrow(0, begin, size));
    const auto input = batch.input.to(dist_.device);
    const auto target = batch.target.to(dist_.device);
    const auto output = mode.evaluation_forward(input);
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
