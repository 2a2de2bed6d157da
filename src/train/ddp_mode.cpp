#include "ddp_mode.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/utils/clip_grad.h>

#include "checkpoint_files.h"
#include "ddp/common/log.h"
#include "ddp/core/powersgd.h"
#include "ddp/train/run_options.h"
#include "ddp/train/state_dict.h"
#include "phase.h"

namespace ddp::train {
namespace {

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

// DDP's no_sync, as PyTorch's guard: around forward and backward (Join's notice says it in
// forward).
class NoSync : public Accumulation {
 public:
  explicit NoSync(core::Reducer& reducer) : guard_(reducer) {}

 private:
  DistributedDataParallelBase::NoSyncGuard guard_;
};

}  // namespace

void DdpMode::build(bool init_sync) {
  // Before the first collective: an elastic member whose group fails in it re-forms and needs
  // an optimizer for the state it is then given.
  optimizer_ = make_optimizer(run_.config, run_.workload.module->parameters());
  wrap(init_sync);
}

void DdpMode::wrap(bool init_sync) {
  auto options = DistributedDataParallelOptions(run_.config.ddp).init_sync(init_sync);
  // A tuned bucket size (bucket-cap-mb auto), once agreed, is the run's: a group re-formed by an
  // elastic change keeps it, as a resumed run does (start_bucket_tuning).
  if (tuned_bucket_cap_bytes_ > 0) {
    options.bucket_cap_mb(core::bytes_to_mib(tuned_bucket_cap_bytes_));
  }
  model_ = DistributedDataParallel(run_.workload.module, run_.dist.group, options);
  register_comm_hook(model_, run_.config, run_.dist.group);
}

std::unique_ptr<Accumulation> DdpMode::accumulate(bool last) {
  if (last) return nullptr;
  return std::make_unique<NoSync>(model_->reducer());
}

torch::Tensor DdpMode::forward(const torch::Tensor& input) {
  return model_->forward_with([&] { return run_.workload.forward(input); });
}

int64_t DdpMode::record_reduction(Timeline* timeline, int64_t step) {
  // Finalize, the reducer's at backward's end (it waited for every bucket and wrote the averages
  // into .grad).
  const core::IterationStats& reduced = model_->reducer().last_iteration();
  if (timeline != nullptr) record_reducer(*timeline, reduced, step);
  return gradient_bytes(reduced);
}

void DdpMode::clip_gradients(double max_norm) {
  torch::nn::utils::clip_grad_norm_(run_.workload.module->parameters(), max_norm);
}

void DdpMode::begin_training() {
  if (run_.config.bucket_cap_auto) start_bucket_tuning();
}

void DdpMode::start_bucket_tuning() {
  const Config& config = run_.config;
  if (tuned_bucket_cap_bytes_ > 0) {
    const double mb = core::bytes_to_mib(tuned_bucket_cap_bytes_);
    model_->set_bucket_cap_mb(mb);
    log::info("bucket-cap-mb auto: {} MiB, as the checkpoint's run chose", mb);
    return;
  }
  if (run_.dist.world_size() == 1) {
    log::info("bucket-cap-mb auto: one rank communicates nothing; buckets of {} MiB",
              config.ddp.bucket_cap_mb());
    return;
  }
  const core::Reducer& reducer = model_->reducer();
  std::vector<double> candidates = core::bucket_cap_candidates(
      reducer.slots(), core::mib_to_bytes(config.ddp.first_bucket_mb()), reducer.bucket_order());
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

void DdpMode::after_step(int64_t step, double seconds) {
  tune_buckets(seconds, step);
}

void DdpMode::tune_buckets(double step_seconds, int64_t step) {
  if (!bucket_tuner_ || !bucket_tuner_->record(step_seconds)) return;
  if (!bucket_tuner_->done()) {
    model_->set_bucket_cap_mb(bucket_tuner_->cap_mb());
    return;
  }
  const Phase phase = step_phase(*run_.dist.group, run_.timeline, "bucket tuning", step);
  const double mb = bucket_tuner_->agree(*run_.dist.group, run_.dist.device);
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

std::string DdpMode::save(Checkpoint c, CheckpointPosition at) {
  fill_optimizer(c);  // a collective where every rank's state is saved
  if (run_.dist.is_main()) c.model = state_dict(*run_.workload.module, kModulePrefix);
  c.bucket_cap_bytes = tuned_bucket_cap_bytes_;
  return write_whole_checkpoint(run_.config, run_.dist, c, at);
}

void DdpMode::fill_optimizer(Checkpoint& c) {
  if (run_.dist.is_main()) c.optimizer_state = byte_tensor(serialized(optimizer()));
}

void DdpMode::load(const Checkpoint& c, const std::string& path,
                   const std::vector<Checkpoint>* shard_files) {
  if (c.shard_rank >= 0) refuse_sharded_checkpoint(path, shard_files != nullptr);
  load_state_dict(*run_.workload.module, c.model, path);
  tuned_bucket_cap_bytes_ = c.bucket_cap_bytes;
  load_optimizer_state(c, path);
}

void DdpMode::load_optimizer_state(const Checkpoint& c, const std::string& path) {
  load_whole_optimizer(c, path, /*zero=*/false);
}

void DdpMode::load_whole_optimizer(const Checkpoint& c, const std::string& path, bool zero) {
  load_optimizer(optimizer(), zero_state_of(c, path, zero, run_.dist.rank()), path,
                 run_.dist.device);
  // A sharded run's checkpoint keeps the element-wise state apart.
  restore_optimizer_tensors(optimizer(), run_.workload.module->parameters(), c.optimizer_tensors,
                            path, run_.dist.device);
}

void DdpMode::fill_heal(Checkpoint& c) {
  c.model = state_dict(*run_.workload.module, kModulePrefix);
  c.bucket_cap_bytes = tuned_bucket_cap_bytes_;
  c.optimizer_state = byte_tensor(serialized(optimizer()));
}

void DdpMode::add_to_digest(Digest& d) {
  const torch::nn::Module& module = *run_.workload.module;
  for (const auto& p : module.parameters()) d.add(p);
  for (const auto& b : module.buffers()) d.add(b);
  add_optimizer_state(d, optimizer(), module.parameters());
}

}  // namespace ddp::train
