#include "ddp/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::data {
namespace {

// `ids` repeated from its head up to `total` (PyTorch pads by repeating the list as often as
// needed: only when the world outnumbers the ids more than once), or truncated to it.
torch::Tensor padded_to(const torch::Tensor& ids, int64_t total) {
  const int64_t n = ids.size(0);
  if (total <= n || n == 0) return ids.narrow(0, 0, std::min(total, n));
  const int64_t repeats = (total + n - 1) / n;
  return ids.repeat({repeats}).narrow(0, 0, total);
}

void check_world(int64_t world, int64_t rank, const char* who) {
  if (world <= 0 || rank < 0 || rank >= world) {
    throw InputError(fmt::format("{}: rank {} is outside [0, world size {})", who, rank, world));
  }
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed) {
  check_world(world_size, rank, "DistributedSampler");
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

torch::Tensor DistributedSampler::sequence(bool uneven) const {
  return uneven ? order() : padded_to(order(), total_size());
}

torch::Tensor DistributedSampler::uneven_indices() const {
  return rank_share(sequence(/*uneven=*/true), world_size_, rank_);
}

torch::Tensor DistributedSampler::indices() const {
  return rank_share(sequence(), world_size_, rank_);
}

int64_t trained_prefix(int64_t length, int64_t world, int64_t per_rank) {
  return std::clamp<int64_t>(per_rank * world, 0, length);
}

torch::Tensor reshard(const torch::Tensor& rest, int64_t world, bool pad) {
  check_world(world, 0, "reshard");
  if (!pad) return rest;
  const int64_t n = rest.size(0);
  return padded_to(rest, (n + world - 1) / world * world);
}

torch::Tensor rank_share(const torch::Tensor& sequence, int64_t world, int64_t rank) {
  check_world(world, rank, "rank_share");
  return sequence.slice(0, rank, std::max<int64_t>(sequence.size(0), rank), world).contiguous();
}

torch::Tensor evaluation_indices(int64_t dataset_size, int64_t world_size, int64_t rank) {
  check_world(world_size, rank, "evaluation_indices");
  if (rank >= dataset_size) return torch::empty({0}, torch::kInt64);  // more ranks than samples
  return torch::arange(rank, dataset_size, world_size, torch::kInt64);
}

}  // namespace ddp::data
