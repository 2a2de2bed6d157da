// ddp_bench_overhead: what DistributedDataParallel costs at world size 1 against the same
// training without it (PyTorch's DDP costs 1.4-5.1 % there on a CPU). The MLP on Fashion-MNIST,
// batch 64, SGD; plain and wrapped runs alternate in rounds; prints the ratio per round.
//   ddp_bench_overhead [ROUNDS]                     the CPU, one thread, backend local
//   launcher --nproc 1 ddp_bench_overhead --device cuda --backend nccl --steps 3000
// On a GPU the data set lies on it (each batch gathered there), and each run ends by waiting for
// its last step's kernels.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cxxopts.hpp>
#include <iostream>
#include <string>

#include "ddp/comm/rendezvous.h"
#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/data/dataset.h"
#include "ddp/models/sequential_models.h"

namespace {

constexpr int64_t kBatch = 64;

struct Run {
  torch::Device device = torch::kCPU;
  int64_t steps = 600;
};

// Seconds for `run.steps` SGD steps of a fresh MLP, wrapped in DDP or not.
double train(const ddp::data::TensorDataset& data, const Run& run, bool wrapped, bool bucket_view,
             const std::shared_ptr<ddp::comm::ProcessGroup>& group) {
  torch::manual_seed(0);
  auto net = ddp::models::make_mlp();
  net->to(run.device);
  ddp::DistributedDataParallel<torch::nn::SequentialImpl> model{nullptr};
  if (wrapped) {
    model = ddp::DistributedDataParallel(
        net, group, ddp::DistributedDataParallelOptions().gradient_as_bucket_view(bucket_view));
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  const auto order =
      torch::randperm(data.size(), torch::TensorOptions(torch::kLong).device(run.device));
  torch::Tensor loss;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < run.steps; ++step) {
    auto batch = data.gather(order.narrow(0, (step * kBatch) % (data.size() - kBatch), kBatch));
    if (wrapped) {
      model->zero_grad();  // dropped (set_to_none), as in the plain loop
    } else {
      // Dropped: the cheapest plain loop, and Optimizer::zero_grad()'s default from LibTorch 2.0
      // on (1.13's zeroes in place: naming it keeps the baseline the same on every release).
      net->zero_grad(/*set_to_none=*/true);
    }
    auto output = wrapped ? model->forward(batch.input) : net->forward(batch.input);
    loss = torch::cross_entropy_loss(output, batch.target);
    loss.backward();
    optimizer.step();
  }
  loss.item<float>();  // waits for a GPU's queued steps
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("ddp_bench_overhead", "DDP at world size 1 against the plain loop");
  options.add_options()("rounds", "rounds of plain, DDP, DDP with bucket views",
                        cxxopts::value<int>()->default_value("7"))(
      "device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))(
      "backend", "the group DDP reduces over: local, or any the launch allows (nccl on cuda)",
      cxxopts::value<std::string>()->default_value("local"))(
      "steps", "SGD steps a run", cxxopts::value<int64_t>()->default_value("600"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("1"))(
      "data", "Fashion-MNIST's folder",
      cxxopts::value<std::string>()->default_value("/usr/share/datasets/fashion-mnist"))(
      "h,help", "print this help");
  options.parse_positional({"rounds"});
  try {
    const auto args = options.parse(argc, argv);
    if (args.count("help") != 0U) {
      std::cout << options.help();
      return 0;
    }
    const int rounds = args["rounds"].as<int>();
    Run run;
    run.steps = args["steps"].as<int64_t>();
    const std::string device = args["device"].as<std::string>();
    if (device != "cpu" && device != "cuda")
      throw ddp::InputError("--device " + device + ": cpu or cuda");
    if (rounds < 1 || run.steps < 1) throw ddp::InputError("--rounds and --steps must be positive");
    if (device == "cuda") run.device = torch::Device(torch::kCUDA, 0);
    torch::set_num_threads(args["threads"].as<int>());
    auto data =
        ddp::data::load_fashion_mnist(args["data"].as<std::string>(), ddp::data::Split::kTrain);
    data.inputs = data.inputs.to(run.device);
    data.targets = data.targets.to(run.device);
    std::shared_ptr<ddp::comm::ProcessGroup> group = ddp::comm::create_process_group(
        args["backend"].as<std::string>(), ddp::comm::detect_launch(ddp::comm::current_env()), {},
        run.device.is_cuda());
    train(data, run, false, false, group);  // warm-up
    std::vector<double> copy_overhead, view_overhead;
    for (int r = 0; r < rounds; ++r) {
      const double plain = train(data, run, false, false, group);
      const double copy = train(data, run, true, false, group);
      const double view = train(data, run, true, true, group);
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
        "median overhead at world size 1 on {} ({}): DDP {:+.1f} %, with gradient_as_bucket_view "
        "{:+.1f} %\n",
        run.device.str(), group->backend_name(), 100 * median(copy_overhead),
        100 * median(view_overhead));
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench_overhead: " << e.what() << "\n";
    return 2;
  }
}
