#pragma once
// The process group of a test worker started as one of real ranks (its launch from the env or
// mpirun): one intra-op thread, and 60-second timeouts, so that a rank that fails ends the others'
// wait well within the test's limit. Header-only.

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/rendezvous.h"

namespace ddp::testing {

inline std::shared_ptr<ddp::comm::ProcessGroup> worker_group(const std::string& backend) {
  torch::set_num_threads(1);
  ddp::comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  options.rendezvous_timeout = std::chrono::seconds(60);
  return ddp::comm::create_process_group(
      backend, ddp::comm::detect_launch(ddp::comm::current_env()), options, false);
}

}  // namespace ddp::testing
