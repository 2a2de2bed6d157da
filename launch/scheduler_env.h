#pragma once
// What a scheduler's own variables say about the job's shape, where the launcher's options
// (command line, DDP_LAUNCH_*, torchrun's PET_*) leave it open. A pure function.
//
// - Per-pod (or per-worker) RANK and WORLD_SIZE, one process each: Volcano's PyTorch plugin,
//   Kubeflow's PyTorchJob without nprocPerNode, Ray Train's workers. Each launcher is then one
//   "node" of one process: --nnodes WORLD_SIZE, --node-rank RANK, --nproc 1, the master from
//   MASTER_ADDR and MASTER_PORT; LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK (as GROUP_RANK), where
//   set, reach the worker as they are (Ray Train starts several workers a host: a rank's threads
//   follow LOCAL_WORLD_SIZE, and the ranks of one GROUP_RANK are one host's). Read only when no
//   option set --nproc, --nnodes or --node-rank: PyTorchJob sets RANK to the pod's index beside
//   its PET_* variables, which then describe the job.
// - NODE_RANK alone (a scheduler that starts one launcher a node), in a job of several nodes:
//   --node-rank, and the master from MASTER_ADDR and MASTER_PORT where the options leave them
//   open. On one node only rank 0 exists, and a NODE_RANK left in the shell is not read.

#include <map>
#include <optional>
#include <string>

namespace ddp::launch {

struct SchedulerShape {
  std::optional<int> nnodes, node_rank, nproc, local_rank, local_world_size, group_rank;
  std::optional<int> master_port;
  std::optional<std::string> master_addr;
  std::string contract;  // what was read, for the launcher's first line; "": nothing
};

// `shape_given`: an option set --nproc, --nnodes or --node-rank; `node_rank_given`: --node-rank
// itself; `nnodes`: the options' --nnodes. Throws InputError naming a variable whose value is not
// what it must be.
SchedulerShape read_scheduler_shape(const std::map<std::string, std::string>& env,
                                    bool shape_given, bool node_rank_given, int nnodes);

}  // namespace ddp::launch
