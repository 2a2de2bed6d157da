#include "sharded_model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/sharded_weights.h"
#include "torch_compat.h"

namespace ddp::train {

ShardedModel::ShardedModel(const Workload& workload, std::shared_ptr<comm::ProcessGroup> group,
                           FullyShardOptions options)
    : module_(workload.module), group_(std::move(group)) {
  model_ = std::make_unique<FullyShardedDataParallel>(module_, workload.units, group_, options);
  state_ = std::make_unique<ShardedState>(*model_, group_);
}

void ShardedModel::broadcast_buffers() {
  broadcast_coalesced(*group_, module_->buffers());  // one broadcast per dtype
}

}  // namespace ddp::train
