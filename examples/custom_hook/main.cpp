// A comm hook of your own: a hierarchical all-reduce, as multi-node jobs use (sum inside each
// "node" first, then across nodes, so the slow links carry a 1/k share of the gradients). It
// uses subgroups (ProcessGroup::new_group), reduce_scatter and all_gather, and registers with
// register_comm_hook(state, hook) as in PyTorch.
//
// It trains a small net for 20 steps twice, in one process: with this hook, and with DDP's
// built-in all-reduce on a copy of the same net. Each rank's model must end equal to the copy's:
// a hook is checked against the built-in before it is trusted with a real job.
//
//   launcher --nproc 4 custom_hook [RANKS_PER_NODE]        (default 2; it must divide the world)
#include <ddp/comm/rendezvous.h>
#include <ddp/core/distributed_data_parallel.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

// The hook's state: this rank's node (ranks node * k ... node * k + k - 1) and the group of the
// ranks at the same position in every node.
struct Hierarchy {
  std::shared_ptr<ddp::comm::ProcessGroup> world, node, across;
};

Hierarchy make_hierarchy(std::shared_ptr<ddp::comm::ProcessGroup> world, int per_node) {
  Hierarchy h{world, nullptr, nullptr};
  const int nodes = world->world_size() / per_node;
  // Every rank creates every group, in the same order; a rank keeps those it belongs to.
  for (int n = 0; n < nodes; ++n) {
    std::vector<int> ranks;
    for (int i = 0; i < per_node; ++i) ranks.push_back(n * per_node + i);
    if (auto g = world->new_group(ranks)) h.node = g;
  }
  for (int i = 0; i < per_node; ++i) {
    std::vector<int> ranks;
    for (int n = 0; n < nodes; ++n) ranks.push_back(n * per_node + i);
    if (auto g = world->new_group(ranks)) h.across = g;
  }
  return h;
}

ddp::FuturePtr hierarchical_hook(Hierarchy& h, ddp::GradBucket& bucket) {
  auto buffer = bucket.buffer();
  const int64_t k = h.node->world_size();
  const int64_t numel = buffer.numel();
  const int64_t padded = (numel + k - 1) / k * k;
  auto input = torch::zeros({padded}, buffer.options());
  input.narrow(0, 0, numel).copy_(buffer);
  auto slice = torch::empty({padded / k}, buffer.options());
  // 1. Inside the node: each rank gets the node's sum of one k-th of the bucket.
  auto work = h.node->reduce_scatter(slice, input, ddp::comm::ReduceOp::kSum);
  // 2. and 3. run when the reducer waits for the bucket (continuations may communicate).
  return ddp::Future::of(work, slice)
      ->then([&h, buffer, numel, padded](torch::Tensor part) mutable {
        h.across->all_reduce(part, ddp::comm::ReduceOp::kSum)->wait();  // 2. across the nodes
        auto whole = torch::empty({padded}, part.options());
        h.node->all_gather(whole, part)->wait();  // 3. inside the node: every part
        buffer.copy_(whole.narrow(0, 0, numel)).div_(h.world->world_size());
        return buffer;
      });
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

// 20 SGD steps on this rank's share of a seeded random problem.
void train(ddp::DistributedDataParallel<NetImpl>& model, int rank) {
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(1000 + rank);
  for (int step = 0; step < 20; ++step) {
    const auto x = torch::randn({32, 16});
    const auto y = x.narrow(1, 0, 4) * 2 - 1;
    model->zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
}

int main(int argc, char** argv) {
  try {
    auto world = ddp::init_process_group();
    const int per_node = argc > 1 ? std::atoi(argv[1]) : 2;
    if (per_node < 1 || world->world_size() % per_node != 0) {
      std::cerr << "RANKS_PER_NODE " << per_node << " does not divide world size "
                << world->world_size() << "\n";
      return 2;
    }
    const auto hierarchy = std::make_shared<Hierarchy>(make_hierarchy(world, per_node));
    Net net, copy;
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net->parameters().size(); ++i)
      copy->parameters()[i].copy_(net->parameters()[i]);
    ddp::DistributedDataParallel hooked(net, world), plain(copy, world);
    hooked->register_comm_hook(hierarchy, hierarchical_hook);
    {
      torch::AutoGradMode grad(true);
      train(hooked, world->rank());
      train(plain, world->rank());
    }
    double diff = 0;
    for (size_t i = 0; i < net->parameters().size(); ++i) {
      diff =
          std::max(diff, (net->parameters()[i] - copy->parameters()[i]).abs().max().item<double>());
    }
    std::cout << "rank " << world->rank() << "/" << world->world_size() << ": "
              << world->world_size() / per_node << " nodes of " << per_node
              << "; hierarchical all-reduce vs built-in: max difference " << diff
              << (diff < 1e-5 ? " (equal)" : " (DIFFERENT)") << std::endl;
    return diff < 1e-5 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
