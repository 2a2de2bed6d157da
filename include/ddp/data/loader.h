#pragma once
// Batches of one epoch, prepared ahead by background threads (PyTorch's DataLoader with
// num_workers and pin_memory): gather, augment, pin, into a bounded queue, handed out in order.
// The batches do not depend on the number of workers: augmentation draws from a generator seeded
// by (seed, epoch, rank, batch index), so a run is reproducible with any --workers.

#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ddp/data/dataset.h"

namespace ddp::data {

// Random crop after zero padding (of the image before normalisation: `pad_value` is what zero
// becomes after it) and random horizontal flip, per sample; images [N, C, H, W].
struct Augment {
  int64_t padding = 4;
  double pad_value = 0.0;
  bool flip = true;
};

// The batch augmented with a generator seeded by `seed`.
Batch augment(const Batch& batch, const Augment& augment, uint64_t seed);

struct LoaderOptions {
  int64_t batch_size = 64;
  int workers = 0;   // 0: batches are prepared on the caller's thread when asked for
  int prefetch = 2;  // batches in flight per worker
  bool pin_memory = false;
  std::optional<Augment> augment;
  uint64_t seed = 0;  // with epoch and rank, seeds each batch's augmentation
  int64_t epoch = 0;
  int64_t first_batch = 0;  // of the epoch, where a resumed epoch begins: its batches' seeds go on
  int64_t rank = 0;
};

class BatchLoader {
 public:
  // The batches of `order` (int64 indices into `dataset`) in order; the last may be smaller.
  // `dataset` must outlive the loader.
  BatchLoader(const TensorDataset& dataset, torch::Tensor order, LoaderOptions options);
  ~BatchLoader();  // stops and joins the workers
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  int64_t num_batches() const { return num_batches_; }
  // The next batch; nullopt after the last. Rethrows a worker's exception.
  std::optional<Batch> next();

 private:
  Batch make(int64_t index) const;
  void work(int worker);

  const TensorDataset& dataset_;
  torch::Tensor order_;
  LoaderOptions options_;
  int64_t num_batches_ = 0;
  int64_t next_ = 0;  // the batch next() returns next

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::optional<Batch>> ready_;  // by batch index; cleared once handed out
  // The error of the lowest batch that failed, raised when next() reaches that batch (as
  // PyTorch's multi-process DataLoader does: _next_data in torch/utils/data/dataloader.py
  // hands out batches in order, errors included), not while earlier batches are still due.
  std::exception_ptr error_;
  int64_t error_batch_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ddp::data
