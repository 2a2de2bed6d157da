#pragma once
// The distributed setup of a training process: how it was launched, its device, its group.

#include <torch/types.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/elastic/elastic.h"
#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"
#include "ddp/train/config.h"

namespace ddp::train {

struct Distributed {
  comm::LaunchInfo launch;  // under --elastic, rank and world size are the membership's
  torch::Device device = torch::kCPU;
  std::shared_ptr<comm::ProcessGroup> group;
  comm::ProcessGroupOptions options;  // the group's
  std::string backend;                // the group's (under --elastic, every generation's)
  // --elastic: the link to the launcher's arbiter, and this worker's current generation.
  std::shared_ptr<comm::ElasticAgent> agent;
  comm::Membership membership;
  // --elastic: this worker joins a running group (DDP_ELASTIC_JOIN=1: the launcher restarted it,
  // or its node came after the group formed) and takes its state from a live peer.
  bool joining = false;
  // --debug-collectives or TORCH_DISTRIBUTED_DEBUG=DETAIL: every group is comm::check_collectives'.
  bool check_collectives = false;
  // Each rank's host (comm::host_key), by rank: the topology hybrid sharding follows. Empty under
  // --elastic, whose members change.
  std::vector<std::string> hosts;

  int rank() const { return group->rank(); }
  int world_size() const { return group->world_size(); }
  // A joiner before join_running_group() has no group, and is no group's rank 0.
  bool is_main() const { return group != nullptr && rank() == 0; }
};

// Reads the launch from `env` (docs/design.md, launch matrix), picks the device (cuda:LOCAL_RANK
// when CUDA is used), creates the process group (config.backend, or the launch's default) and logs,
// on rank 0, the topology of all ranks. Throws InputError on bad env or a backend that does not
// fit; CommError when the rendezvous does not complete. An elastic joiner (`joining`) gets no group
// here: join_running_group() makes it once the worker's own work is done.
Distributed init_distributed(const Config& config, const comm::Env& env);

// --elastic, a joiner: tells the launcher it is ready and joins the running group's next
// generation. Called after the worker loaded its data and built its model, which take a LibTorch
// process about 0.5 s: said ready before them, the group would wait for them in its state
// transfer, every member idle (Note [A joiner is ready once its own work is done]).
void join_running_group(Distributed& d);

// Intra-op threads for a rank when neither --threads nor OMP_NUM_THREADS chose (`configured` 0,
// `omp_num_threads_set` false): 0 (keep LibTorch's default) unless this host's ranks would share
// cores. A rank bound to fewer cores than the host has (mpirun binds each rank to one under Open
// MPI 4, Slurm gives each task its CPUs) takes the cores it may run on; an unbound one (Open MPI 5
// with --oversubscribe binds none) takes its share of them, at least 1. Never more than
// `default_threads`, LibTorch's own default. Ranks whose OpenMP threads outnumber their cores spin
// against each other: under Open MPI 5 an epoch of the Fashion-MNIST MLP on 2 ranks took 7.0 s
// with 2 threads each, 2.6 s with 1. A pure function.
int threads_per_rank(int configured, bool omp_num_threads_set, int default_threads,
                     int affinity_cores, int host_cores, int local_world_size);

// threads_per_rank() for this process: its affinity mask, this host's online cores, LibTorch's
// current default, OMP_NUM_THREADS in `env`.
int threads_for_this_process(int configured, const comm::Env& env, int local_world_size);

// Sets this process's intra-op threads: LibTorch's, and OpenBLAS's where the host's BLAS is
// OpenBLAS (whose pthreads build does not follow LibTorch's count).
void set_intra_op_threads(int threads);

// --elastic: replaces d.group by the group of the next generation that includes this worker
// (blocks until the launcher publishes it), and d.launch's rank and world size by its own.
void join_next_generation(Distributed& d);

// --elastic: runs `form` (joining a generation's group, and taking its state after a change)
// until a generation forms. One that loses a member while it forms (its group's connection, the
// state's transfer: a CommError) is given up for the next, which the launcher publishes without
// that member; a round's first generation and a joiner's are no different from a re-forming's.
// Five in a row failing are a group that cannot connect: the fifth's error is thrown.
void until_a_generation_forms(Distributed& d, const std::function<void()>& form);

// "auto" picks CUDA when available. CUDA devices are cuda:local_rank; throws InputError for
// "cuda" without CUDA, or a local rank without a GPU of its own unless `share_gpus` (backend gloo,
// which takes CUDA tensors through the host: ranks share the GPUs, cuda:local_rank % count).
torch::Device resolve_device(const std::string& name, int cuda_device_count, int local_rank,
                             bool share_gpus = false);

struct RankTopology {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  std::string device;
};
// Whether --hierarchical (`setting`: auto, true, false) wraps the group, for these ranks' host
// keys: "" for no, else the line to log. Throws InputError for true on a layout it cannot serve.
// A pure function.
std::string hierarchy_decision(const std::string& setting, const std::vector<std::string>& hosts);

// The table rank 0 prints once: one line per rank.
std::string format_topology(const std::vector<RankTopology>& ranks, const std::string& backend);

// All ranks learn whether every rank succeeded: each rank that failed rethrows its own error,
// the others throw an Error naming what failed elsewhere. A collective.
void agree_all_ok(const Distributed& dist, const std::exception_ptr& error,
                  const std::string& what);

}  // namespace ddp::train
