#include "ddp/train/step_timer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "phase.h"

namespace ddp::train {
using Clock = std::chrono::steady_clock;

StepTimer::StepTimer(const Distributed& dist, Options options, Timeline* timeline)
    : dist_(dist),
      options_(options),
      timeline_(timeline),
      generation_(dist.membership.generation) {}

StepTimer::Timed::Timed(StepTimer& timer, StepPhase phase)
    : timer_(timer),
      phase_(phase),
      start_(Clock::now()),
      group_(timer.dist_.group.get()),
      blocked_start_(group_->blocked_seconds()) {
  if (phase == StepPhase::kData) timer_.step_ = StepTimes{};
}

StepTimer::Timed::~Timed() {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  StepTimes& step = timer_.step_;
  if (phase_ == StepPhase::kData) {  // no collective waits for data
    step.data_s = seconds;
    return;
  }
  // Under --elastic the group may be gone (replaced) meanwhile: then nothing was blocked in it.
  const double blocked = timer_.dist_.group.get() == group_
                             ? std::max(0.0, group_->blocked_seconds() - blocked_start_)
                             : 0.0;
  step.comm_s += blocked;
  (phase_ == StepPhase::kCompute ? step.compute_s : step.optimizer_s) =
      std::max(0.0, seconds - blocked);
}

bool StepTimer::exchanges() const {
  return options_.threshold > 0.0 && dist_.world_size() > 1 && !options_.uneven;
}

void StepTimer::follow_generation() {
  if (dist_.membership.generation == generation_) return;
  generation_ = dist_.membership.generation;
  window_ = StepTimes{};
  window_steps_ = 0;
}

void StepTimer::count_step() {
  follow_generation();
  window_ += step_;
  ++window_steps_;
}

void StepTimer::exchange_if_due(int64_t step) {
  if (exchanges() && step % options_.every == 0) exchange(step);
}

void StepTimer::exchange_rest(int64_t step) {
  follow_generation();
  if (exchanges() && window_steps_ > 0) exchange(step);
}

void StepTimer::record_window() const {
  if (!timeline_ || window_steps_ == 0) return;
  // This rank's ms a step over the window, as a graph.
  const double ms = 1000.0 / static_cast<double>(window_steps_);
  timeline_->add_counter("step ms", Clock::now(),
                         {{"data", window_.data_s * ms},
                          {"compute", window_.compute_s * ms},
                          {"comm", window_.comm_s * ms},
                          {"optimizer", window_.optimizer_s * ms}});
}

void StepTimer::exchange(int64_t step) {
  follow_generation();
  const Phase phase(*dist_.group, fmt::format("step {}: straggler figures", step));
  record_window();
  // The window's sums and its step count. A new generation starts a new window on every member
  // (follow_generation), so every rank counted the same steps; the count is exchanged to check it.
  std::vector<double> figures = to_doubles(window_);
  figures.push_back(static_cast<double>(std::exchange(window_steps_, 0)));
  window_ = StepTimes{};
  const auto n = static_cast<int64_t>(figures.size());
  const at::Tensor rows =
      comm::all_gather_rows(*dist_.group, torch::tensor(figures, torch::kDouble), dist_.device)
          .contiguous();
  std::vector<StepTimes> ranks;
  for (int r = 0; r < dist_.world_size(); ++r) {
    ranks.push_back(step_times_from(rows.data_ptr<double>() + r * n));
  }
  const at::Tensor counts = rows.select(1, n - 1).to(torch::kLong).contiguous();
  const int64_t steps = counts[0].item<int64_t>();
  DDP_CHECK(comm::ranks_differing(counts.view({-1, 1}), 0).empty(),
            fmt::format("step {}: the ranks counted different steps in the window ({})", step,
                        fmt::join(counts.data_ptr<int64_t>(),
                                  counts.data_ptr<int64_t>() + counts.numel(), ", ")));
  if (steps == 0) return;  // a re-forming at the window's last step: nothing to judge
  // Every rank's flight record keeps the verdict, for the hang doctor (the same on every rank).
  const auto verdict = find_straggler(ranks, steps, options_.threshold);
  dist_.group->set_straggler(verdict ? straggler_message(*verdict, step - steps + 1, step) : "");
  if (!dist_.is_main()) return;  // rank 0 logs (after an elastic change, the new rank 0)
  if (!record_) record_.emplace(options_.threshold);
  const auto lines = record_->add_window(ranks, steps, step);
  if (!lines.info.empty()) log::info("{}", lines.info);
  if (!lines.warning.empty()) log::warn("{}", lines.warning);
  for (const std::string& line : {lines.info, lines.warning}) {  // marked where they were seen
    if (timeline_ && !line.empty()) timeline_->add_instant(line, Clock::now());
  }
}

void StepTimer::take_epoch(EpochMetrics& m) {
  if (!record_) return;
  m.rank_times = record_->epoch();
  m.rank_times_steps = record_->epoch_steps();
  m.straggler = record_->epoch_straggler();
  record_->begin_epoch();
}

void StepTimer::log_table() const {
  if (!record_ || record_->run_steps() == 0) return;
  log::info("step times per rank over {} steps (ms a step):", record_->run_steps());
  for (const auto& line : straggler_table(record_->run(), record_->run_steps())) {
    log::info("  {}", line);
  }
}

}  // namespace ddp::train
