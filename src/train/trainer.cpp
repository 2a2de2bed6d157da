#include "ddp/train/trainer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/data/distributed_sampler.h"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void make_output_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("output dir '{}': cannot create it: {}", dir, ec.message()));
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        const std::vector<torch::Tensor>& params) {
  if (c.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(
                    c.weight_decay));
  }
  if (c.optimizer == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  if (c.optimizer == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  throw InputError(fmt::format("key 'optimizer': unknown optimizer '{}'", c.optimizer));
}

namespace {
// Checks everything a user can get wrong before any rank waits for the others.
Config prepared(Config config) {
  validate(config);
  if (config.nesterov && (config.optimizer != "sgd" || config.momentum <= 0.0)) {
    throw InputError("key 'nesterov': needs optimizer sgd with a momentum > 0");
  }
  make_output_dir(config.output_dir);
  return config;
}
}  // namespace

Trainer::Trainer(Config config)
    : config_(prepared(std::move(config))), dist_(init_distributed(config_, comm::current_env())) {
  if (config_.threads > 0) torch::set_num_threads(static_cast<int>(config_.threads));
  workload_ = make_workload(config_);
  workload_.module->to(dist_.device);
  optimizer_ = make_optimizer(config_, workload_.module->parameters());
  schedule_.kind = config_.lr_schedule;
  schedule_.base_lr = config_.lr;
  schedule_.warmup_epochs = config_.warmup_epochs;
  schedule_.step_size = config_.lr_step_size;
  schedule_.gamma = config_.lr_gamma;
  schedule_.total_epochs = config_.epochs;
  std::ofstream(std::filesystem::path(config_.output_dir) / "config.yaml") << to_yaml(config_);
}

TrainResult Trainer::run() {
  TrainResult result;
  MetricsWriter metrics_file((std::filesystem::path(config_.output_dir) / "metrics.jsonl").string());
  result.metrics_path = metrics_file.path();
  log::info("training {} on {} ({} train / {} test samples) on {}, {} threads, batch {}",
            config_.model, config_.dataset, workload_.train_set.size(), workload_.test_set.size(),
            dist_.device.str(), torch::get_num_threads(), config_.batch_size);

  for (int64_t epoch = 0; epoch < config_.epochs; ++epoch) {
    EpochMetrics m;
    m.epoch = epoch + 1;
    train_epoch(epoch, m);

    // Evaluate every eval_every epochs, and always after the last one.
    const bool last = epoch + 1 == config_.epochs;
    if (last || (config_.eval_every > 0 && (epoch + 1) % config_.eval_every == 0)) {
      const Evaluation eval = evaluate();
      m.test_loss = eval.loss;
      m.test_accuracy = eval.accuracy;
    }

    // Log and record the epoch.
    log::info("epoch {}/{}: train loss {:.4f}, test loss {}, test accuracy {}, {:.0f} samples/s, "
              "{:.2f} s, lr {:.4g}",
              m.epoch, config_.epochs, m.train_loss,
              m.test_loss ? fmt::format("{:.4f}", *m.test_loss) : "-",
              m.test_accuracy ? fmt::format("{:.4f}", *m.test_accuracy) : "-", m.samples_per_s,
              m.epoch_seconds, m.lr);
    metrics_file.write(m);
    result.epochs.push_back(m);
  }

  const EpochMetrics& final = result.epochs.back();
  log::info("done: {} epochs, test loss {:.4f}{}, {:.0f} samples/s; metrics in {}", config_.epochs,
            final.test_loss.value_or(NAN),
            final.test_accuracy ? fmt::format(", test accuracy {:.4f}", *final.test_accuracy) : "",
            final.samples_per_s, result.metrics_path);
  return result;
}

void Trainer::train_epoch(int64_t epoch, EpochMetrics& m) {
  const auto& train_set = workload_.train_set;
  data::DistributedSampler sampler(train_set.size(), /*world_size=*/1, /*rank=*/0, /*shuffle=*/true,
                                   static_cast<uint64_t>(config_.seed));
  sampler.set_epoch(epoch);
  const torch::Tensor order = sampler.indices();
  const int64_t n = order.size(0);
  const int64_t steps_per_epoch = (n + config_.batch_size - 1) / config_.batch_size;

  workload_.module->train();
  double loss_sum = 0.0;
  const auto start = Clock::now();
  for (int64_t begin = 0; begin < n; begin += config_.batch_size) {
    // Next batch.
    const int64_t size = std::min(config_.batch_size, n - begin);
    data::Batch batch = train_set.gather(order.narrow(0, begin, size));
    auto input = batch.input.to(dist_.device);
    auto target = batch.target.to(dist_.device);

    // Forward, loss, backward, step.
    m.lr = lr_at(schedule_, step_, steps_per_epoch);
    set_lr(*optimizer_, m.lr);
    optimizer_->zero_grad();
    auto loss = compute_loss(train_set.task, workload_.forward(input), target);
    loss.backward();
    optimizer_->step();
    ++step_;

    loss_sum += loss.item<double>() * static_cast<double>(size);
  }
  m.epoch_seconds = seconds_since(start);
  m.steps = step_;
  m.train_loss = loss_sum / static_cast<double>(n);
  m.samples_per_s = static_cast<double>(n) / m.epoch_seconds;
}

Evaluation Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  workload_.module->eval();
  const auto& test_set = workload_.test_set;
  const int64_t n = test_set.size();
  const torch::Tensor order = data::evaluation_indices(n, /*world_size=*/1, /*rank=*/0);
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += config_.batch_size) {
    const int64_t size = std::min(config_.batch_size, n - begin);
    data::Batch batch = test_set.gather(order.narrow(0, begin, size));
    auto target = batch.target.to(dist_.device);
    auto output = workload_.forward(batch.input.to(dist_.device));
    loss_sum += compute_loss(test_set.task, output, target).item<double>() * static_cast<double>(size);
    if (test_set.task == data::Task::kClassification) {
      correct += output.argmax(1).eq(target).sum().item<int64_t>();
    }
  }
  Evaluation out;
  out.loss = loss_sum / static_cast<double>(n);
  if (test_set.task == data::Task::kClassification) {
    out.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  workload_.module->train();
  return out;
}

}  // namespace ddp::train
