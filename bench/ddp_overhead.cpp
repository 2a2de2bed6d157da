// ddp_bench_overhead: what DistributedDataParallel costs at world size 1 against the same
// training without it (PyTorch's DDP costs 1.4-5.1 % there). The MLP on Fashion-MNIST, batch 64,
// one thread, SGD; plain and wrapped runs alternate in rounds; prints the ratio per round.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/data/dataset.h"
#include "ddp/models/sequential_models.h"

namespace {

constexpr int64_t kBatch = 64;
constexpr int64_t kSteps = 600;

// Seconds for kSteps SGD steps of a fresh MLP, wrapped in DDP or not.
double train(const ddp::data::TensorDataset& data, bool wrapped, bool bucket_view,
             const std::shared_ptr<ddp::comm::ProcessGroup>& group) {
  torch::manual_seed(0);
  auto net = ddp::models::make_mlp();
  ddp::DistributedDataParallel<torch::nn::SequentialImpl> model{nullptr};
  if (wrapped) {
    model = ddp::DistributedDataParallel(
        net, group, ddp::DistributedDataParallelOptions().gradient_as_bucket_view(bucket_view));
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  const auto order = torch::randperm(data.size(), torch::kLong);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < kSteps; ++step) {
    auto batch = data.gather(order.narrow(0, (step * kBatch) % (data.size() - kBatch), kBatch));
    if (wrapped) {
      model->zero_grad();  // dropped (set_to_none), as in the plain loop
    } else {
      // Dropped: the cheapest plain loop, and Optimizer::zero_grad()'s default from LibTorch 2.0
      // on (1.13's zeroes in place: naming it keeps the baseline the same on every release).
      net->zero_grad(/*set_to_none=*/true);
    }
    auto output = wrapped ? model->forward(batch.input) : net->forward(batch.input);
    torch::cross_entropy_loss(output, batch.target).backward();
    optimizer.step();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  torch::set_num_threads(1);
  const auto data =
      ddp::data::load_fashion_mnist("/usr/share/datasets/fashion-mnist", ddp::data::Split::kTrain);
  std::shared_ptr<ddp::comm::ProcessGroup> group =
      ddp::comm::create_process_group("local", ddp::comm::detect_launch({}), {}, false);
  train(data, false, false, group);  // warm-up
  std::vector<double> copy_overhead, view_overhead;
  for (int r = 0; r < rounds; ++r) {
    const double plain = train(data, false, false, group);
    const double copy = train(data, true, false, group);
    const double view = train(data, true, true, group);
    copy_overhead.push_back(copy / plain - 1.0);
    view_overhead.push_back(view / plain - 1.0);
    std::cout << fmt::format(
        "round {}: plain {:.3f} s, DDP {:.3f} s ({:+.1f} %), DDP with gradient_as_bucket_view "
        "{:.3f} s ({:+.1f} %)\n",
        r, plain, copy, 100 * copy_overhead.back(), view, 100 * view_overhead.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::cout << fmt::format(
      "median overhead at world size 1: DDP {:+.1f} %, with gradient_as_bucket_view {:+.1f} %\n",
      100 * median(copy_overhead), 100 * median(view_overhead));
}
