#include "ddp/data/dataset.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "ddp/common/error.h"
#include "ddp/data/idx.h"

namespace ddp::data {

Batch TensorDataset::gather(const torch::Tensor& indices) const {
  return Batch{inputs.index_select(0, indices), targets.index_select(0, indices)};
}

TensorDataset TensorDataset::slice(int64_t begin, int64_t end) const {
  DDP_CHECK(0 <= begin && begin <= end && end <= size(), "slice() beyond the dataset");
  TensorDataset out = *this;
  out.inputs = inputs.narrow(0, begin, end - begin);
  out.targets = targets.narrow(0, begin, end - begin);
  return out;
}

namespace {

// Debian ships the .gz files; a user may have unpacked them.
std::string find_file(const std::string& dir, const std::string& stem) {
  const std::filesystem::path base(dir);
  for (const char* suffix : {".gz", ""}) {
    const auto candidate = base / (stem + suffix);
    if (std::filesystem::exists(candidate)) return candidate.string();
  }
  throw InputError(
      fmt::format("{}: no such file (nor without .gz): is the Fashion-MNIST directory "
                  "right? Debian's dataset-fashion-mnist installs it in "
                  "/usr/share/datasets/fashion-mnist",
                  (base / (stem + ".gz")).string()));
}

}  // namespace

TensorDataset load_fashion_mnist(const std::string& dir, Split split, int64_t max_items) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  // Each file is checked as soon as it is found, so the error names the first bad one.
  // Only the first max_items are read (a short run on a subset of the 60,000 training images
  // gunzipped all of them, most of its start-up).
  const std::string image_path = find_file(dir, prefix + "-images-idx3-ubyte");
  IdxArray images = read_idx(image_path, 3, max_items);
  const std::string label_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray labels = read_idx(label_path, 1, max_items);
  if (images.dims[0] != labels.dims[0]) {
    throw InputError(fmt::format("{} holds {} images but {} holds {} labels", image_path,
                                 images.dims[0], label_path, labels.dims[0]));
  }
  const int64_t n = images.items;
  for (int64_t i = 0; i < n; ++i) {
    if (labels.values[static_cast<size_t>(i)] >= 10) {
      throw InputError(fmt::format("{}: label {} of item {} is outside [0, 10)", label_path,
                                   labels.values[static_cast<size_t>(i)], i));
    }
  }
  // A pixel has 256 values: normalise those with the tensor operations that normalising every
  // pixel would take (so every value is bitwise what they give), then look each pixel up. One
  // pass over the floats instead of four, and only over the images kept: loading was most of a
  // short run's time.
  const auto table = torch::arange(256, torch::kFloat32)
                         .div_(255.0)
                         .sub_(kFashionMnistMean)
                         .div_(kFashionMnistStd);
  const float* normalised = table.data_ptr<float>();
  TensorDataset out;
  out.inputs = torch::empty({n, 1, images.dims[1], images.dims[2]}, torch::kFloat32);
  float* pixels = out.inputs.data_ptr<float>();
  const uint8_t* bytes = images.values.data();
  const int64_t count = out.inputs.numel();
  for (int64_t i = 0; i < count; ++i) pixels[i] = normalised[bytes[i]];
  // from_blob does not own the bytes: the conversion to int64 makes the owned copy.
  out.targets = torch::from_blob(labels.values.data(), {n}, torch::kUInt8).to(torch::kInt64);
  out.task = Task::kClassification;
  out.num_classes = 10;
  return out;
}

TensorDataset make_random_dataset(int64_t rows, int64_t features, int64_t outputs, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  TensorDataset out;
  auto weight = at::randn({features, outputs}, gen, torch::kFloat32);
  out.inputs = at::randn({rows, features}, gen, torch::kFloat32);
  auto noise = at::randn({rows, outputs}, gen, torch::kFloat32).mul_(0.1);
  out.targets = out.inputs.matmul(weight).add_(noise);
  out.task = Task::kRegression;
  return out;
}

}  // namespace ddp::data
