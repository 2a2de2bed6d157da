#include "zero_mode.h"

#include <torch/torch.h>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/train/run_options.h"

namespace ddp::train {

void ZeroMode::build(bool init_sync) {
  wrap(init_sync);
  zero_ = std::make_unique<ZeroRedundancyOptimizer>(
      run_.workload.module->parameters(), run_.dist.group, optimizer_factory());
}

void ZeroMode::fill_optimizer(Checkpoint& c) {
  // Every rank's shard of the state, for rank 0 to write.
  const std::vector<std::string> shards =
      comm::all_gather_bytes(*run_.dist.group, serialized(optimizer()), run_.dist.device);
  if (!run_.dist.is_main()) return;
  c.optimizer_state = torch::empty({0}, torch::kByte);
  for (const auto& shard : shards) c.optimizer_shards.push_back(byte_tensor(shard));
}

void ZeroMode::load_optimizer_state(const Checkpoint& c, const std::string& path) {
  const Distributed& dist = run_.dist;
  if (static_cast<int64_t>(c.optimizer_shards.size()) == dist.world_size() ||
      c.optimizer_shards.empty()) {
    load_whole_optimizer(c, path, /*zero=*/true);
    return;
  }
  const int saved_world = load_resharded_zero_state(
      c, path, optimizer_factory(), *zero_, run_.workload.module->parameters(), dist.rank(), dist.device);
  if (dist.is_main()) {
    log::info("{}: the optimizer state of {} ranks' shards resharded over {} ranks", path,
              saved_world, dist.world_size());
  }
}

}  // namespace ddp::train
