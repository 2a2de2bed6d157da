#include "fault_injector.h"

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::train {
namespace {

// The variable's value as read by strtoll/strtod (garbage reads as 0), or `fallback` when unset.
const char* value_or(const comm::Env& env, const std::string& name, const char* fallback) {
  const auto it = env.find(name);
  return it == env.end() ? fallback : it->second.c_str();
}

// The step of hook DDP_TEST_<name>_AT_STEP on this rank; 0: never.
int64_t hook_step(const comm::Env& env, int rank, int restart_count, const std::string& name) {
  const std::string prefix = "DDP_TEST_" + name;
  if (restart_count != 0 ||
      std::strtoll(value_or(env, prefix + "_RANK", "0"), nullptr, 10) != rank) {
    return 0;
  }
  return std::strtoll(value_or(env, prefix + "_AT_STEP", "0"), nullptr, 10);
}

}  // namespace

FaultInjector::FaultInjector(const comm::Env& env, int restart_count, comm::ProcessGroup& group)
    : rank_(group.rank()),
      crash_at_step_(hook_step(env, rank_, restart_count, "CRASH")),
      sigterm_at_step_(hook_step(env, rank_, restart_count, "SIGTERM")),
      perturb_at_step_(hook_step(env, rank_, restart_count, "PERTURB")),
      delay_seq_(std::strtoull(value_or(env, "DDP_TEST_DELAY_SEQ", "0"), nullptr, 10)),
      delay_rank_(std::atoi(value_or(env, "DDP_TEST_DELAY_RANK", "0"))),
      delay_s_(std::atof(value_or(env, "DDP_TEST_DELAY_S", "0"))),
      write_delay_ms_(std::atoi(value_or(env, "DDP_TEST_WRITE_DELAY_MS", "0"))) {
  if (delay_seq_ != 0 && delay_rank_ == rank_) {
    group.set_issue_hook([seq = delay_seq_, seconds = delay_s_](const comm::CollectiveInfo& info) {
      if (info.seq != seq) return;
      log::warn("rank {}: test hook: waiting {} s before {} #{}", info.rank, seconds, info.op,
                info.seq);
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    });
  }
  if (write_delay_ms_ > 0) {
    set_write_chunk_hook(
        [ms = write_delay_ms_] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  }
}

FaultInjector::~FaultInjector() {
  if (write_delay_ms_ > 0) set_write_chunk_hook(nullptr);
}

void FaultInjector::after_step(int64_t step, torch::nn::Module& module) const {
  if (step == crash_at_step_) {
    log::warn("rank {}: test hook: SIGKILL at step {}", rank_, step);
    spdlog::default_logger()->flush();
    ::kill(::getpid(), SIGKILL);
  }
  if (step == sigterm_at_step_) ::kill(::getpid(), SIGTERM);
  if (step == perturb_at_step_) {
    torch::NoGradGuard no_grad;
    module.parameters().front().add_(1e-3);
  }
}

}  // namespace ddp::train
