#pragma once
// How this process was started, read from its environment (docs/design.md, launch matrix): its
// rank, world and rendezvous address, and the backend that the launch and device call for. Pure
// functions of the env, free of LibTorch (library ddp::launch_info); the factory that turns a
// launch into a process group is rendezvous.h's.

#include <cstddef>
#include <map>
#include <string>

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

// The backend for this launch and device: nccl on CUDA; on CPU local for world size 1, shm
// (shared memory within a host, over gloo; over mpi under mpirun) where there are several, but
// mpi under mpirun across hosts. A pure function.
std::string default_backend(const LaunchInfo& launch, bool cuda_device);

// A CUDA device this process sees (rendezvous.h's list_cuda_devices(); a rank's device is
// cuda:local_rank among them).
struct CudaDevice {
  int index = 0;
  std::string name;
  size_t total_memory = 0;  // bytes
};

}  // namespace ddp::comm
