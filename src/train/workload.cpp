#include "ddp/train/workload.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/common/error.h"
#include "ddp/models/resnet.h"
#include "ddp/models/sequential_models.h"

namespace ddp::train {
namespace {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The DataParallel tutorial: 100 random vectors of size 5, a Linear(5, 2).
constexpr int64_t kRandomRows = 100;
constexpr int64_t kRandomFeatures = 5;
constexpr int64_t kRandomOutputs = 2;

template <class Holder>
std::function<torch::Tensor(const torch::Tensor&)> forward_of(Holder holder) {
  return [holder](const torch::Tensor& x) mutable { return holder->forward(x); };
}

}  // namespace

Workload make_workload(const Config& config, const models::NormFactory& norm) {
  Workload w;
  if (config.dataset == "fashion-mnist") {
    const std::string dir = config.data.empty() ? kDefaultFashionMnistDir : config.data;
    w.train_set = data::load_fashion_mnist(dir, data::Split::kTrain);
    w.test_set = data::load_fashion_mnist(dir, data::Split::kTest);
  } else if (config.dataset == "random") {
    // One seeded draw so train and test share the target map; the test half follows the train half.
    auto all = data::make_random_dataset(2 * kRandomRows, kRandomFeatures, kRandomOutputs,
                                         static_cast<uint64_t>(config.seed));
    w.train_set = all.slice(0, kRandomRows);
    w.test_set = all.slice(kRandomRows, 2 * kRandomRows);
  } else {
    throw InputError(fmt::format("unknown dataset '{}'", config.dataset));
  }
  if (config.train_subset > 0 && config.train_subset < w.train_set.size()) {
    w.train_set = w.train_set.slice(0, config.train_subset);
  }

  torch::manual_seed(static_cast<uint64_t>(config.seed));
  if (config.model == "mlp") {
    auto net = models::make_mlp(w.train_set.inputs[0].numel(), w.train_set.num_classes);
    w.module = net.ptr();
    w.forward = forward_of(net);
  } else if (config.model == "resnet18") {
    auto net = models::make_resnet18(w.train_set.num_classes, w.train_set.inputs.size(1), norm);
    w.module = net.ptr();
    w.forward = forward_of(net);
  } else if (config.model == "linear") {
    auto net = models::make_linear(w.train_set.inputs.size(1), w.train_set.targets.size(1));
    w.module = net.ptr();
    w.forward = forward_of(net);
  } else {
    throw InputError(fmt::format("unknown model '{}'", config.model));
  }
  return w;
}

torch::Tensor compute_loss(data::Task task, const torch::Tensor& output,
                           const torch::Tensor& target) {
  if (task == data::Task::kClassification) return torch::cross_entropy_loss(output, target);
  return torch::mse_loss(output, target);
}

}  // namespace ddp::train
