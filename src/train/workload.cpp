#include "ddp/train/workload.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <sstream>

#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/models/informer.h"
#include "ddp/models/resnet.h"
#include "ddp/models/sequential_models.h"
#include "ddp/nn/forward_hooks.h"

namespace ddp::train {
namespace {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The DataParallel tutorial: 100 random vectors of size 5, a Linear(5, 2).
constexpr int64_t kRandomRows = 100;
constexpr int64_t kRandomFeatures = 5;
constexpr int64_t kRandomOutputs = 2;

// The modules of type `M` inside `net`, in registration order (the order its forward runs them).
template <class M>
std::vector<std::shared_ptr<torch::nn::Module>> units_of_type(const torch::nn::Module& net) {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& module : net.modules(/*include_self=*/false)) {
    if (module->as<M>() != nullptr) units.push_back(module);
  }
  return units;
}

std::function<torch::Tensor(const torch::Tensor&)> forward_of(torch::nn::Sequential holder) {
  // Child by child (the Sequential's own forward, as ddp::nn::call's hooks see it): a sharded
  // model gathers each unit around its call (ddp/core/fully_shard.h).
  return [holder](const torch::Tensor& x) mutable { return nn::forward_sequential(*holder, x); };
}

// The csv dataset: windows over the file's (or the synthetic series') training, validation and
// test parts.
void load_csv(const Config& config, Workload& w) {
  const data::TimeSeriesOptions& o = config.time_series;
  data::TimeSeriesData series;
  if (config.data.empty()) {
    log::info("no data file: the synthetic series (scripts/make_timeseries_csv writes it)");
    std::istringstream text(data::synthetic_time_series_csv());
    series = data::load_time_series(data::parse_csv(text, "<synthetic series>"),
                                    "<synthetic series>", o);
  } else {
    series = data::load_time_series(config.data, o);
  }
  w.train_set = data::window_dataset(series, series.train, o);
  w.val_set = data::window_dataset(series, series.val, o);
  w.test_set = data::window_dataset(series, series.test, o);
}

// The informer over a window dataset's inputs ([B, seq_len + pred_len, columns + 4], see
// data::window_dataset): the encoder reads the first seq_len rows; the decoder the last label_len
// of them followed by zeros in place of the future values (Informer's generative input), with
// the marks of all its rows, which are known in advance.
void make_informer(const Config& config, Workload& w) {
  models::InformerOptions o = config.informer;
  const int64_t columns = w.train_set.inputs.size(2) - 4;
  const int64_t outputs = w.train_set.targets.size(2);
  o.enc_in = o.dec_in = columns;
  o.c_out = outputs;
  o.seq_len = config.time_series.seq_len;
  o.label_len = config.time_series.label_len;
  o.pred_len = config.time_series.pred_len;
  models::Informer net(o);
  w.module = net.ptr();
  w.units = net->layers();
  w.forward = [net, o, columns](const torch::Tensor& window) mutable {
    auto values = window.narrow(2, 0, columns);
    auto marks = window.narrow(2, columns, 4);
    auto known = values.narrow(1, o.seq_len - o.label_len, o.label_len);
    auto x_dec = torch::cat(
        {known, torch::zeros({window.size(0), o.pred_len, columns}, values.options())}, 1);
    return net->forward(values.narrow(1, 0, o.seq_len), marks.narrow(1, 0, o.seq_len), x_dec,
                        marks.narrow(1, o.seq_len - o.label_len, o.label_len + o.pred_len));
  };
  // The naive forecast: the last known value of each output column, repeated.
  w.naive = [o, columns, outputs](const torch::Tensor& window) {
    return window.narrow(1, o.seq_len - 1, 1)
        .narrow(2, columns - outputs, outputs)
        .expand({window.size(0), o.pred_len, outputs});
  };
}

// A Sequential model's module, its units (the modules of type `Unit` in it) and its forward.
template <class Unit>
void set_sequential(Workload& w, torch::nn::Sequential net) {
  w.module = net.ptr();
  w.units = units_of_type<Unit>(*net);
  w.forward = forward_of(net);
}

// The training and test sets of config.dataset, cut to --train-subset and --test-subset.
void load_data(const Config& config, Workload& w) {
  if (config.dataset == "fashion-mnist") {
    const std::string dir = config.data.empty() ? kDefaultFashionMnistDir : config.data;
    w.train_set = data::load_fashion_mnist(dir, data::Split::kTrain, config.train_subset);
    w.test_set = data::load_fashion_mnist(dir, data::Split::kTest, config.test_subset);
  } else if (config.dataset == "random") {
    // One seeded draw so train and test share the target map; the test half follows the train half.
    auto all = data::make_random_dataset(2 * kRandomRows, kRandomFeatures, kRandomOutputs,
                                         static_cast<uint64_t>(config.seed));
    w.train_set = all.slice(0, kRandomRows);
    w.test_set = all.slice(kRandomRows, 2 * kRandomRows);
  } else if (config.dataset == "csv") {
    load_csv(config, w);
  } else {
    throw InputError(fmt::format("unknown dataset '{}'", config.dataset));
  }
  if (config.train_subset > 0 && config.train_subset < w.train_set.size()) {
    w.train_set = w.train_set.slice(0, config.train_subset);
  }
  for (data::TensorDataset* set : {&w.test_set, w.val_set ? &*w.val_set : nullptr}) {
    if (set != nullptr && config.test_subset > 0 && config.test_subset < set->size()) {
      *set = set->slice(0, config.test_subset);
    }
  }
}

// config.model for the data `w` holds, seeded from config.seed.
void make_model(const Config& config, Workload& w, const models::NormFactory& norm) {
  torch::manual_seed(static_cast<uint64_t>(config.seed));
  const int64_t classes = w.train_set.num_classes;
  if (config.model == "mlp") {
    set_sequential<torch::nn::LinearImpl>(w,
                                          models::make_mlp(w.train_set.inputs[0].numel(), classes));
  } else if (config.model == "wide-mlp") {
    set_sequential<torch::nn::LinearImpl>(
        w,
        models::make_wide_mlp(w.train_set.inputs[0].numel(), classes, config.width, config.depth));
  } else if (config.model == "resnet18") {
    set_sequential<models::ResidualImpl>(
        w, models::make_resnet18(classes, w.train_set.inputs.size(1), norm));
  } else if (config.model == "linear") {
    set_sequential<torch::nn::LinearImpl>(
        w, models::make_linear(w.train_set.inputs.size(1), w.train_set.targets.size(1)));
  } else if (config.model == "informer") {
    make_informer(config, w);
  } else {
    throw InputError(fmt::format("unknown model '{}'", config.model));
  }
}

}  // namespace

Workload make_workload(const Config& config, const models::NormFactory& norm) {
  Workload w;
  load_data(config, w);
  make_model(config, w, norm);
  return w;
}

torch::Tensor compute_loss(data::Task task, const torch::Tensor& output,
                           const torch::Tensor& target) {
  if (task == data::Task::kClassification) return torch::cross_entropy_loss(output, target);
  return torch::mse_loss(output, target);
}

}  // namespace ddp::train
