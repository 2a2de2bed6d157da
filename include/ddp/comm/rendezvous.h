#pragma once
// How this process was started, read from its environment (docs/design.md, launch matrix), and the
// factory that turns that into a process group. The decisions are pure functions of the env.
// Most programs need only ddp::init_process_group() at the end of this header.

#include <torch/arg.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::comm {

enum class Launcher {
  kNone,    // a plain run: world size 1
  kEnv,     // torchrun's env contract: our launcher, torchrun, Kubeflow PyTorchJob
  kMpirun,  // Open MPI: OMPI_COMM_WORLD_*
  kSlurm,   // srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ MASTER_ADDR/PORT)
};
const char* to_string(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty when the launcher gives none
  int master_port = 0;      // 0 when the launcher gives none
  // DDP_JOB_TOKEN: the secret the rendezvous store asks of every client ("" when the launcher
  // gave none: then the store accepts any client, as c10d's TCPStore does).
  std::string job_token;
  // torchrun's static rendezvous (its default): its agent already serves a c10d TCPStore at
  // MASTER_ADDR:MASTER_PORT and the workers are its clients (TORCHELASTIC_USE_AGENT_STORE=True).
  bool agent_store = false;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  // Where master_addr / master_port came from when the launch derived them (Slurm without
  // MASTER_ADDR / MASTER_PORT), e.g. "MASTER_ADDR n01 from SLURM_STEP_NODELIST's first host,
  // MASTER_PORT 15123 from SLURM_JOB_ID 4123"; "" when they were set.
  std::string rendezvous_origin;
};

using Env = std::map<std::string, std::string>;
Env current_env();

// The host a rank counts as (for the hierarchical all-reduce, and for shared memory): its host
// name, and its node's rank where the launch names one (GROUP_RANK: the launcher's --node-rank,
// torchrun's), so that two nodes a launcher was told of are two hosts even on one machine.
std::string host_key(const std::string& host_name, const Env& env);

// Reads the launch from `env`. The env contract (RANK and WORLD_SIZE set) wins over
// OMPI_COMM_WORLD_* and SLURM_*, as torchrun's does. Under Slurm, MASTER_ADDR and MASTER_PORT
// default to first_slurm_host() of the step's node list and slurm_port() of SLURM_JOB_ID, as in
// PyTorch Lightning. Throws InputError naming the variable for a non-numeric value,
// RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, or a missing MASTER_ADDR / MASTER_PORT
// where a TCP store is needed (env contract and Slurm with world > 1).
LaunchInfo detect_launch(const Env& env);

// The first host of a Slurm node list in its compressed form: "n[01-04,07],gpu1" -> "n01".
// Throws InputError for an unclosed bracket or an empty list.
std::string first_slurm_host(const std::string& nodelist);

// Lightning's rendezvous port for a Slurm job: 15000 + the job id's last four digits (15000 to
// 24999). Throws InputError naming SLURM_JOB_ID when it is not a number.
int slurm_port(const std::string& job_id);

// The backend for this launch and device: nccl on CUDA; on CPU mpi under mpirun, gloo under the
// env contract or Slurm, local for world size 1.
std::string default_backend(const LaunchInfo& launch, bool cuda_device);

// The backends compiled into this build, e.g. {"local", "gloo", "mpi"}.
std::vector<std::string> compiled_backends();

struct CudaDevice {
  int index = 0;
  std::string name;
  size_t total_memory = 0;  // bytes
};
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
