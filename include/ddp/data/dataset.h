#pragma once
// In-memory datasets held as two tensors; batches are gathered by index (one index_select per
// tensor, no per-sample copies).

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace ddp::data {

enum class Task { kClassification, kRegression };

struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  int64_t size() const { return input.size(0); }
};

struct TensorDataset {
  torch::Tensor inputs;   // [N, ...] float32
  torch::Tensor targets;  // [N] int64 class labels, or [N, ...] float32 regression targets
  Task task = Task::kClassification;
  int64_t num_classes = 0;  // classification only

  int64_t size() const { return inputs.size(0); }
  // The rows named by `indices` (int64, any order, repeats allowed), in that order.
  Batch gather(const torch::Tensor& indices) const;
  // Rows [begin, end); a view, no copy.
  TensorDataset slice(int64_t begin, int64_t end) const;
};

// Fashion-MNIST mean and standard deviation of the training pixels in [0, 1].
constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

enum class Split { kTrain, kTest };

// Loads `{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz` from `dir` (plain files without .gz
// are accepted too). Images become float32 [N, 1, 28, 28] normalised with the mean and std
// above; labels int64 [N]. Throws InputError naming the file on a missing or corrupt file,
// a count mismatch between images and labels, or a label outside [0, 10). `max_items` > 0 reads
// and checks the first max_items only (idx.h's read_idx), of a file whose header holds more.
TensorDataset load_fashion_mnist(const std::string& dir, Split split, int64_t max_items = 0);

// The DataParallel tutorial's RandomDataset: `rows` vectors of `features` standard normal values,
// seeded. Targets (for a loss to train on) are a seeded linear map of the inputs plus small
// noise, `outputs` values per row; slice it for train and test sets that share the map.
TensorDataset make_random_dataset(int64_t rows, int64_t features, int64_t outputs, uint64_t seed);

}  // namespace ddp::data
