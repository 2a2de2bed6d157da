#include "ddp/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>

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

// As torch.utils.data.DistributedSampler.__init__.
int64_t samples_per_rank(int64_t dataset_size, int64_t world, bool drop_last) {
  if (drop_last && dataset_size % world != 0) {
    return (dataset_size - world + world - 1) / world;  // ceil
  }
  return (dataset_size + world - 1) / world;
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor value;
  if (!archive.try_read(std::string("ddp_sampler.") + key, value) || value.numel() != 1) {
    throw InputError(fmt::format(
        "DistributedSampler::load: the archive has no ddp_sampler.{} (not a DistributedSampler's "
        "state)",
        key));
  }
  return value.item<int64_t>();
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      state_(std::make_shared<State>()) {
  check_world(world_size, rank, "DistributedSampler");
  if (dataset_size < 0) throw InputError("DistributedSampler: negative dataset size");
  state_->dataset_size = dataset_size;
  state_->num_samples = samples_per_rank(dataset_size, world_size, drop_last);
}

DistributedSampler DistributedSampler::for_evaluation(int64_t dataset_size, int64_t world_size,
                                                      int64_t rank) {
  DistributedSampler sampler(dataset_size, world_size, rank, /*shuffle=*/false);
  sampler.evaluation_ = true;
  return sampler;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch == state_->epoch) return;
  state_->epoch = epoch;
  state_->position = 0;
  state_->resumed = false;
  state_->epoch_indices = torch::Tensor();
}

torch::Tensor DistributedSampler::order() const {
  if (!shuffle_) return torch::arange(state_->dataset_size, torch::kInt64);
  auto gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(state_->epoch));
  return torch::randperm(state_->dataset_size, gen, torch::kInt64);
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

void DistributedSampler::reset(c10::optional<size_t> new_size) {
  State& s = *state_;
  if (new_size) {
    s.dataset_size = static_cast<int64_t>(*new_size);
    s.num_samples = samples_per_rank(s.dataset_size, world_size_, drop_last_);
    s.resumed = false;
  }
  if (!std::exchange(s.resumed, false)) s.position = 0;
  s.epoch_indices = torch::Tensor();
}

c10::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  State& s = *state_;
  if (!s.epoch_indices.defined()) s.epoch_indices = evaluation_ ? uneven_indices() : indices();
  const int64_t left = s.epoch_indices.size(0) - s.position;
  if (left <= 0) return c10::nullopt;
  const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(batch_size));
  const int64_t* first = s.epoch_indices.data_ptr<int64_t>() + s.position;
  s.position += n;
  return std::vector<size_t>(first, first + n);
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  save(archive, state_->position);
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive, int64_t trained) const {
  if (trained < 0 || trained > state_->position) {
    throw InputError(fmt::format(
        "DistributedSampler::save: {} indices trained, but the sampler has handed out {} this "
        "epoch",
        trained, state_->position));
  }
  const auto put = [&](const char* key, int64_t value) {
    archive.write(std::string("ddp_sampler.") + key, torch::tensor(value, torch::kInt64));
  };
  put("epoch", state_->epoch);
  put("position", trained);
  for (const auto& [key, value] : order_keys()) put(key, value);
}

std::vector<std::pair<const char*, int64_t>> DistributedSampler::order_keys() const {
  return {{"dataset_size", state_->dataset_size},
          {"world_size", world_size_},
          {"seed", static_cast<int64_t>(seed_)},
          {"shuffle", shuffle_},
          {"drop_last", drop_last_},
          {"evaluation", evaluation_}};
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  for (const auto& [key, mine] : order_keys()) {
    const int64_t saved = read_int(archive, key);
    if (saved != mine) {
      throw InputError(fmt::format(
          "DistributedSampler::load: the state was saved with {} {}, this sampler has {}: its "
          "order would differ (build the sampler as the saved one was, or start the epoch over)",
          key, saved, mine));
    }
  }
  const int64_t epoch = read_int(archive, "epoch"), position = read_int(archive, "position");
  // Evaluation's shares are unpadded: a rank's may be one shorter than the saving rank's.
  const int64_t share = evaluation_
                            ? evaluation_indices(state_->dataset_size, world_size_, rank_).size(0)
                            : state_->num_samples;
  if (position < 0 || position > share) {
    throw InputError(
        fmt::format("DistributedSampler::load: position {} is outside this rank's {} indices",
                    position, share));
  }
  set_epoch(epoch);
  state_->position = position;
  state_->resumed = true;
  state_->epoch_indices = torch::Tensor();
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
