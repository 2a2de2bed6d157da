// One rank of the Join test (test_join.cpp): trains the DDP tests' net with ddp::join on this
// rank's batches (3 + 2 * rank of them) from OUT_DIR/join.pt, which PyTorch's own DDP with Join
// wrote (tests/python/join_reference.py), and compares the final parameters with PyTorch's.
//   join_worker BACKEND OUT_DIR
// Exits 0 when every parameter is within 1e-5 (relative to its largest element) of PyTorch's.
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>
#include <map>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/join.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"

namespace join_worker {

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(8, 32));
    b = register_module("b", torch::nn::Linear(32, 32));
    c = register_module("c", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c(torch::relu(b(torch::relu(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Net);

int run(const std::shared_ptr<ddp::comm::ProcessGroup>& group, const std::string& dir) {
  const int rank = group->rank(), world = group->world_size();
  const std::string path = dir + "/join.pt";
  std::map<std::string, torch::Tensor> file;
  for (auto& [key, value] : ddp::train::state_dict_from(ddp::train::read_pt_file(path), path)) {
    file[key] = value;
  }
  torch::manual_seed(static_cast<uint64_t>(rank));  // each rank its own start: DDP broadcasts
  Net net;
  if (rank == 0) {
    torch::NoGradGuard no_grad;
    for (auto& item : net->named_parameters()) item.value().copy_(file.at("init." + item.key()));
  }
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int batches = 3 + 2 * rank;
  ddp::join(model, [&] {
    for (int k = 0; k < batches; ++k) {
      model->zero_grad();
      const auto x = file.at(fmt::format("x.{}.{}", rank, k));
      const auto y = file.at(fmt::format("y.{}.{}", rank, k));
      torch::mse_loss(model->forward(x), y).backward();
      optimizer.step();
    }
  });
  double worst = 0.0;
  for (const auto& item : net->named_parameters()) {
    const auto& theirs = file.at("final." + item.key());
    const double scale = std::max(theirs.abs().max().item<double>(), 1e-6);
    worst = std::max(worst, (item.value() - theirs).abs().max().item<double>() / scale);
  }
  std::cout << fmt::format(
      "rank {}/{}: {} batches, max relative error from PyTorch's Join {:.3g} (tolerance 1e-05)\n",
      rank, world, batches, worst);
  return worst <= 1e-5 ? 0 : 4;
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: join_worker BACKEND OUT_DIR\n";
    return 64;
  }
  try {
    torch::set_num_threads(1);
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    ddp::comm::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(30);
    options.rendezvous_timeout = std::chrono::seconds(30);
    return run(ddp::comm::create_process_group(argv[1], launch, options, false), argv[2]);
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 5;
  }
}

}  // namespace join_worker
