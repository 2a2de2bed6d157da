#pragma once
// The distributed setup of a training process: how it was launched, its device, its group.

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/rendezvous.h"
#include "ddp/train/config.h"

namespace ddp::train {

struct Distributed {
  comm::LaunchInfo launch;
  torch::Device device = torch::kCPU;
  std::shared_ptr<comm::ProcessGroup> group;

  int rank() const { return group->rank(); }
  int world_size() const { return group->world_size(); }
  bool is_main() const { return rank() == 0; }
};

// Reads the launch from `env` (docs/design.md, launch matrix), picks the device (cuda:LOCAL_RANK
// when CUDA is used), creates the process group (config.backend, or the launch's default) and logs,
// on rank 0, the topology of all ranks. Throws InputError on bad env or a backend that does not
// fit; CommError when the rendezvous does not complete.
Distributed init_distributed(const Config& config, const comm::Env& env);

// "auto" picks CUDA when available. CUDA devices are cuda:local_rank; throws InputError for
// "cuda" without CUDA, or a local rank without a GPU of its own.
torch::Device resolve_device(const std::string& name, int cuda_device_count, int local_rank);

struct RankTopology {
  int rank = 0;
  std::string host;
  int local_rank = 0;
  std::string device;
};
// The table rank 0 prints once: one line per rank.
std::string format_topology(const std::vector<RankTopology>& ranks, const std::string& backend);

}  // namespace ddp::train
