// One rank of the SyncBatchNorm test (started by test_sync_batch_norm.cpp with the env
// contract): its shard of a global batch through SyncBatchNorm, against plain BatchNorm on the
// whole batch computed here too. Prints the largest differences; exits 1 when one is over 1e-5.
#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/sync_batch_norm.h"

namespace sync_bn_worker {

int run(int /*argc*/, char** /*argv*/) {
  const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
  std::shared_ptr<ddp::comm::ProcessGroup> group =
      ddp::comm::create_process_group("gloo", launch, {}, false);
  const int rank = launch.rank, world = launch.world_size;

  // The global batch, the same on every rank: 10 samples, so 3 ranks get 4, 3 and 3.
  torch::manual_seed(42);
  const int64_t n = 10, channels = 3;
  const auto x = torch::randn({n, channels, 4, 5}) * 3 + 1;
  const auto g = torch::randn({n, channels, 4, 5});  // d(loss)/d(output)
  const auto weight = torch::rand({channels}) + 0.5, bias = torch::randn({channels});
  const int64_t begin = rank * n / world, end = (rank + 1) * n / world;

  // Reference: BatchNorm2d on the whole batch, loss = sum(output * g).
  torch::nn::BatchNorm2d reference(channels);
  reference->weight.data().copy_(weight);
  reference->bias.data().copy_(bias);
  auto x_ref = x.clone().requires_grad_(true);
  auto y_ref = reference->forward(x_ref);
  (y_ref * g).sum().backward();

  // This rank's shard through SyncBatchNorm, loss = sum over the shard.
  ddp::SyncBatchNorm sync(channels, group);
  sync->weight.data().copy_(weight);
  sync->bias.data().copy_(bias);
  auto x_mine = x.slice(0, begin, end).clone().requires_grad_(true);
  auto y_mine = sync->forward(x_mine);
  (y_mine * g.slice(0, begin, end)).sum().backward();
  // Weight and bias gradients are per rank (DDP reduces them): their sum is the whole batch's.
  auto grads = torch::cat({sync->weight.grad(), sync->bias.grad()});
  group->all_reduce(grads, ddp::comm::ReduceOp::kSum)->wait();

  auto diff = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>();
  };
  const double d_out = diff(y_mine, y_ref.slice(0, begin, end));
  const double d_input = diff(x_mine.grad(), x_ref.grad().slice(0, begin, end));
  const double d_params =
      diff(grads, torch::cat({reference->weight.grad(), reference->bias.grad()}));
  const double d_running = std::max(diff(sync->running_mean, reference->running_mean),
                                    diff(sync->running_var, reference->running_var));
  // Eval mode uses the running statistics: equal too.
  sync->eval();
  reference->eval();
  const double d_eval = diff(sync->forward(x), reference->forward(x));
  fmt::print(
      "rank {}: output {:.3g}, input grad {:.3g}, weight/bias grads {:.3g}, running {:.3g}, "
      "eval {:.3g}\n",
      rank, d_out, d_input, d_params, d_running, d_eval);
  const double worst = std::max({d_out, d_input, d_params, d_running, d_eval});
  return worst <= 1e-5 ? 0 : 1;
}

}  // namespace sync_bn_worker
