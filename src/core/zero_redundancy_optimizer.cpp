#include "ddp/core/zero_redundancy_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"

namespace ddp {

std::vector<int> partition_parameters(const std::vector<int64_t>& numels, int world_size) {
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Python's sorted(..., reverse=True) is stable: equal sizes keep their order.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> sizes(static_cast<size_t>(world_size), 0);
  std::vector<int> owners(numels.size(), 0);
  for (size_t i : order) {
    const auto lightest = std::min_element(sizes.begin(), sizes.end()) - sizes.begin();
    owners[i] = static_cast<int>(lightest);
    sizes[static_cast<size_t>(lightest)] += numels[i];
  }
  return owners;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::Tensor> params,
                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                 const OptimizerFactory& make)
    : params_(std::move(params)), group_(std::move(group)) {
  DDP_CHECK(!params_.empty(), "ZeroRedundancyOptimizer needs parameters");
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  owners_ = partition_parameters(numels, group_->world_size());
  shards_.resize(static_cast<size_t>(group_->world_size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    shards_[static_cast<size_t>(owners_[i])].push_back(params_[i]);
  }
  // A rank may own nothing (more ranks than parameters): its optimizer gets an empty group.
  local_ = make(shards_[static_cast<size_t>(group_->rank())]);
  DDP_CHECK(local_ != nullptr, "the optimizer factory returned an optimizer");
}

void ZeroRedundancyOptimizer::step() {
  local_->step();
  for (int owner = 0; owner < group_->world_size(); ++owner) {
    broadcast_coalesced(*group_, shards_[static_cast<size_t>(owner)], owner);
  }
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  torch::serialize::OutputArchive archive;
  local_->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return static_cast<int64_t>(out.str().size());
}

}  // namespace ddp
