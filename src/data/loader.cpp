#include "ddp/data/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "ddp/common/error.h"

namespace ddp::data {
namespace {

// One generator seed from the parts, well mixed (splitmix64), so that nearby batches differ.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

Batch augment(const Batch& batch, const Augment& a, uint64_t seed) {
  DDP_CHECK(batch.input.dim() == 4, "augment: images [N, C, H, W]");
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t n = batch.input.size(0), h = batch.input.size(2), w = batch.input.size(3);
  const auto padded = torch::constant_pad_nd(
      batch.input, {a.padding, a.padding, a.padding, a.padding}, a.pad_value);
  const auto offsets = torch::randint(0, 2 * a.padding + 1, {n, 2}, generator, torch::kLong);
  const auto flips = torch::rand({n}, generator, torch::kFloat).lt(0.5);
  auto out = torch::empty_like(batch.input);
  for (int64_t i = 0; i < n; ++i) {
    auto crop = padded[i]
                    .narrow(1, offsets[i][0].item<int64_t>(), h)
                    .narrow(2, offsets[i][1].item<int64_t>(), w);
    out[i].copy_(a.flip && flips[i].item<bool>() ? crop.flip({2}) : crop);
  }
  return {out, batch.target};
}

BatchLoader::BatchLoader(const TensorDataset& dataset, torch::Tensor order, LoaderOptions options)
    : dataset_(dataset), order_(std::move(order)), options_(std::move(options)) {
  DDP_CHECK(options_.batch_size > 0 && options_.workers >= 0 && options_.prefetch > 0,
            "BatchLoader: positive batch size and prefetch");
  num_batches_ = (order_.size(0) + options_.batch_size - 1) / options_.batch_size;
  ready_.resize(static_cast<size_t>(num_batches_));
  for (int w = 0; w < options_.workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
}

Batch BatchLoader::make(int64_t index) const {
  const int64_t begin = index * options_.batch_size;
  const int64_t size = std::min(options_.batch_size, order_.size(0) - begin);
  Batch batch = dataset_.gather(order_.narrow(0, begin, size));
  if (options_.augment) {
    const uint64_t seed = mix(mix(mix(options_.seed) ^ static_cast<uint64_t>(options_.epoch)) ^
                              static_cast<uint64_t>(options_.rank)) ^
                          static_cast<uint64_t>(options_.first_batch + index);
    batch = augment(batch, *options_.augment, mix(seed));
  }
  if (options_.pin_memory) {
    batch.input = batch.input.pin_memory();
    batch.target = batch.target.pin_memory();
  }
  return batch;
}

// Worker w prepares batches w, w + workers, ..., never more than `prefetch` per worker ahead of
// the consumer.
void BatchLoader::work(int worker) {
  const int64_t ahead = static_cast<int64_t>(options_.workers) * options_.prefetch;
  for (int64_t i = worker; i < num_batches_; i += options_.workers) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || i < next_ + ahead; });
      if (stopping_) return;
    }
    try {
      Batch batch = make(i);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_[static_cast<size_t>(i)] = std::move(batch);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_ || i < error_batch_) {
        error_ = std::current_exception();
        error_batch_ = i;
      }
    }
    changed_.notify_all();
  }
}

std::optional<Batch> BatchLoader::next() {
  if (next_ >= num_batches_) return std::nullopt;
  if (threads_.empty()) return make(next_++);
  std::unique_lock<std::mutex> lock(mutex_);
  auto& slot = ready_[static_cast<size_t>(next_)];
  changed_.wait(lock, [&] { return slot.has_value() || (error_ && error_batch_ == next_); });
  if (!slot.has_value()) std::rethrow_exception(error_);
  Batch batch = std::move(*slot);
  slot.reset();
  ++next_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace ddp::data
