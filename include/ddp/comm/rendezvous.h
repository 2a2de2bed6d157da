#pragma once
// The factory that turns a launch (launch_info.h: how this process was started) into a process
// group, and what this build can make: its backends, the CUDA devices it sees. Most programs need
// only ddp::init_process_group() at the end of this header.

#include <torch/arg.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"

namespace ddp::comm {

// The backends compiled into this build, e.g. {"local", "gloo", "mpi"}.
std::vector<std::string> compiled_backends();

// The CUDA devices this process sees (after CUDA_VISIBLE_DEVICES); empty on a machine without
// GPUs or in a build whose LibTorch has no CUDA.
std::vector<CudaDevice> list_cuda_devices();

// Creates the process group `backend` for `launch`. Throws InputError for a backend that is not
// compiled in, does not fit the device (nccl on CPU, gloo/mpi on... CUDA tensors are copied by the
// caller), or needs what the launch lacks (mpi outside mpirun, gloo without MASTER_ADDR/PORT).
// Throws InputError when the rendezvous port is already in use, CommError when the rendezvous
// does not complete within options.timeout.
std::unique_ptr<ProcessGroup> create_process_group(const std::string& backend,
                                                   const LaunchInfo& launch,
                                                   const ProcessGroupOptions& options,
                                                   bool cuda_device);

}  // namespace ddp::comm

namespace ddp {

// What init_process_group() may override; every default follows the launch.
struct InitProcessGroupOptions {
  TORCH_ARG(std::string, backend) = "";  // "": comm::default_backend() of the launch and device
  TORCH_ARG(bool, cuda_device) = false;  // true when this rank's tensors live on its GPU
  TORCH_ARG(std::chrono::milliseconds, timeout) = comm::ProcessGroupOptions().timeout;
  TORCH_ARG(std::chrono::milliseconds,
            rendezvous_timeout) = comm::ProcessGroupOptions().rendezvous_timeout;
};

// Joins the process group of this process's launch, as torch.distributed.init_process_group()
// does: rank and world size from however it was started (comm::detect_launch(
// comm::current_env()): the launcher, torchrun, mpirun, srun, or alone as world size 1 with the
// local backend), then comm::create_process_group(). Throws what those two throw.
//   auto group = ddp::init_process_group();
std::shared_ptr<comm::ProcessGroup> init_process_group(const InitProcessGroupOptions& options = {});

}  // namespace ddp
