#include "ddp/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/common/error.h"

namespace ddp::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw InputError(
        fmt::format("DistributedSampler: rank {} is outside [0, world size {})", rank, world_size));
  }
  if (dataset_size < 0) throw InputError("DistributedSampler: negative dataset size");
  // As torch.utils.data.DistributedSampler.__init__.
  if (drop_last && dataset_size % world_size != 0) {
    num_samples_ = (dataset_size - world_size + world_size - 1) / world_size;  // ceil
  } else {
    num_samples_ = (dataset_size + world_size - 1) / world_size;
  }
}

torch::Tensor DistributedSampler::order() const {
  if (!shuffle_) return torch::arange(dataset_size_, torch::kInt64);
  auto gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(epoch_));
  return torch::randperm(dataset_size_, gen, torch::kInt64);
}

torch::Tensor DistributedSampler::uneven_indices() const {
  return order().slice(0, rank_, dataset_size_, world_size_).contiguous();
}

torch::Tensor DistributedSampler::indices() const {
  torch::Tensor all = order();
  const int64_t total = total_size();
  if (total > dataset_size_ && dataset_size_ > 0) {
    // Pad with the head of the list, repeated as often as needed (only when world > size).
    const int64_t repeats = (total + dataset_size_ - 1) / dataset_size_;
    all = all.repeat({repeats}).narrow(0, 0, total);
  } else {
    all = all.narrow(0, 0, total);
  }
  return all.slice(0, rank_, total, world_size_).contiguous();
}

torch::Tensor evaluation_indices(int64_t dataset_size, int64_t world_size, int64_t rank) {
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    throw InputError(
        fmt::format("evaluation_indices: rank {} is outside [0, world size {})", rank, world_size));
  }
  if (rank >= dataset_size) return torch::empty({0}, torch::kInt64);  // more ranks than samples
  return torch::arange(rank, dataset_size, world_size, torch::kInt64);
}

}  // namespace ddp::data
