#pragma once
// Where each rank's step time goes, and which rank is slow (straggler.h judges). The training loop
// marks each step's phases on a StepTimer; every --straggler-every steps the ranks exchange their
// sums over that window (one all_gather of a few numbers, a collective), every rank's flight record
// keeps the verdict (the hang doctor's "before the stall") and rank 0 names a straggler, or its
// recovery. The loop holds no step times itself:
//
//   { const auto timed = timer.time(StepPhase::kData); batches = next_batches(); }
//   { const auto timed = timer.time(StepPhase::kCompute); forward and backward; }
//   { const auto timed = timer.time(StepPhase::kOptimizer); optimizer step; }
//   timer.count_step();
//   ...
//   timer.exchange_if_due(step);  // in the periodic blocks

#include <chrono>
#include <cstdint>
#include <optional>

#include "ddp/train/distributed.h"
#include "ddp/train/metrics.h"
#include "ddp/train/straggler.h"
#include "ddp/train/timeline.h"

namespace ddp::train {

enum class StepPhase {
  kData,       // waiting for the step's batches: a step's first phase
  kCompute,    // forward and backward
  kOptimizer,  // the optimizer step
};

class StepTimer {
 public:
  struct Options {
    double threshold = 0.0;  // --straggler-threshold (0: no exchange)
    int64_t every = 0;       // --straggler-every
    bool uneven = false;     // --uneven: a rank out of batches joins, and is no straggler
  };
  // `dist` outlives the timer; under --elastic its group is replaced, and a new generation
  // starts a new window on every member, so that a step dropped by the re-forming is counted
  // nowhere. `timeline` (--timeline) may be null.
  StepTimer(const Distributed& dist, Options options, Timeline* timeline);

  // The time of one phase of the step, from its construction to its destruction: less the time
  // blocked in the group's collectives meanwhile, which counts as the step's comm_s (--zero's
  // broadcasts, the GradScaler's inf check). The data phase begins a step: the times of a step
  // that found no batch are dropped by the next.
  class Timed {
   public:
    Timed(StepTimer& timer, StepPhase phase);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    StepTimer& timer_;
    StepPhase phase_;
    std::chrono::steady_clock::time_point start_;
    const comm::ProcessGroup* group_;  // the group at the start (replaced: nothing blocked)
    double blocked_start_;
  };
  Timed time(StepPhase phase) { return Timed(*this, phase); }

  // The step whose phases were timed is applied: its times go into the window.
  void count_step();
  // After step `step`, every --straggler-every steps: the exchange (a collective).
  void exchange_if_due(int64_t step);
  // At the run's end, after step `step`: the last window, however short (a collective), so that
  // a run of fewer steps than --straggler-every has its figures too.
  void exchange_rest(int64_t step);
  // Rank 0: the figures of this epoch's windows into `metrics` (rank_times, straggler); the next
  // epoch's begin.
  void take_epoch(EpochMetrics& metrics);
  // Rank 0, at the end of the run: each rank's mean step times over the windows exchanged.
  void log_table() const;

 private:
  // Whether the ranks exchange their step times: a threshold above 0, several ranks, and every
  // rank in every step (not under --uneven, where a rank out of batches joins).
  bool exchanges() const;
  void follow_generation();  // a new generation: a new window
  // Every rank's times over the window that ends at `step` (an all_gather of 5 doubles each).
  void exchange(int64_t step);
  void record_window() const;  // --timeline: this rank's window as a "step ms" counter

  const Distributed& dist_;
  Options options_;
  Timeline* timeline_;
  StepTimes step_;    // the step in progress
  StepTimes window_;  // this rank's sums over the window in progress, of window_steps_ steps
  int64_t window_steps_ = 0;
  int64_t generation_;                     // the window's
  std::optional<StragglerRecord> record_;  // rank 0's record of the windows exchanged
};

}  // namespace ddp::train
