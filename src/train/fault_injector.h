#pragma once
// The test hooks of ddp_train, read once from the DDP_TEST_* variables and kept out of the
// training loop and the library's classes. A production run sets none: every hook is then off.
//
//   DDP_TEST_<X>_AT_STEP=N and DDP_TEST_<X>_RANK=r (default 0) act on rank r after its N-th
//   optimizer step, in the first run of a job only (restart count 0: the restarted run goes
//   through). X is one of
//     CRASH    the rank kills itself with SIGKILL (the launcher's restart test, the fault tests);
//     SIGTERM  the rank sends itself a SIGTERM (--checkpoint-on-signal's test);
//     PERTURB  the rank changes its first parameter (the divergence check's test).
//   DDP_TEST_DELAY_SEQ=N, DDP_TEST_DELAY_RANK=r (default 0), DDP_TEST_DELAY_S=s: rank r waits
//     s seconds before issuing its N-th collective (the hang tests). Collectives issued before
//     the injector exists (the process group's set-up) are counted but never delayed.
//   DDP_TEST_WRITE_DELAY_MS=ms: every atomic file write sleeps ms after each 64 KiB (a test kills
//     the process in the middle of a checkpoint).

#include <torch/nn/module.h>

#include <cstdint>

#include "ddp/comm/process_group.h"
#include "ddp/comm/rendezvous.h"

namespace ddp::train {

class FaultInjector {
 public:
  // Reads the hooks of `group`'s rank from `env` (`restart_count`: the launch's, 0 in the first
  // run) and installs those that act outside the training loop: the delay before a collective of
  // `group` (its issue hook) and the pause in file writes (process-wide, until the destruction).
  // Installs nothing where the variables are not set.
  FaultInjector(const comm::Env& env, int restart_count, comm::ProcessGroup& group);
  ~FaultInjector();
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // The hooks of optimizer step `step` (1-based, just taken): SIGKILL (after logging
  // "rank r: test hook: SIGKILL at step N" and flushing the log), SIGTERM, or the perturbation
  // of `module`'s first parameter.
  void after_step(int64_t step, torch::nn::Module& module) const;

 private:
  int rank_;
  int64_t crash_at_step_ = 0;  // 0: never
  int64_t sigterm_at_step_ = 0;
  int64_t perturb_at_step_ = 0;
  uint64_t delay_seq_ = 0;  // 0: no delay
  int delay_rank_ = 0;
  double delay_s_ = 0.0;
  int write_delay_ms_ = 0;  // 0: none
};

}  // namespace ddp::train
