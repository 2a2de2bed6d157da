// One rank of the multi-process DistributedDataParallel tests (test_ddp.cpp). Trains a small
// model for 5 steps with DDP, per-rank batch B, and, in the same process, the same model without
// DDP on the global batch of world * B samples; exits 0 only if the parameters agree.
//   ddp_worker BACKEND SCENARIO
// SCENARIO: sgd | nosync | adam | fp16 | bf16 | custom-hook | powersgd-warmup | bucket-view |
//           unused | unused-find | mismatch | overlap | buffers | no-buffers
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/powersgd.h"

namespace {

constexpr int64_t kIn = 8, kHidden = 32, kOut = 4, kBatch = 6, kSteps = 5;

// A model with a head that can be left out of the loss (the unused-parameter scenarios).
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t hidden, bool with_unused) {
    a = register_module("a", torch::nn::Linear(kIn, hidden));
    b = register_module("b", torch::nn::Linear(hidden, kHidden));
    c = register_module("c", torch::nn::Linear(kHidden, kOut));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c(torch::relu(b(torch::relu(a(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr}, unused{nullptr};
};
TORCH_MODULE(Net);

Net make_net(uint64_t seed, int64_t hidden, bool with_unused) {
  torch::manual_seed(seed);
  return Net(hidden, with_unused);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& scenario,
                                                        std::vector<torch::Tensor> params) {
  if (scenario == "adam")
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

double max_relative_error(Net ours, Net reference) {
  double worst = 0.0;
  auto p = ours->parameters();
  auto q = reference->parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    const double scale = std::max(q[i].abs().max().item<double>(), 1e-6);
    worst = std::max(worst, (p[i] - q[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// BatchNorm's running statistics are buffers: each rank's forward updates them from its own
// batch. With broadcast_buffers, rank 0's are broadcast before each forward, so after
// pre_forward() every rank holds rank 0's; without, they stay apart. Prints their checksum.
// A user's hook: counts the buckets it reduced, then the plain average.
struct CountingState {
  std::shared_ptr<ddp::comm::ProcessGroup> group;
  int64_t buckets = 0;
  int64_t last_buckets = 0;  // of those, the last of their iteration
};

ddp::FuturePtr counting_hook(CountingState& state, ddp::GradBucket& bucket) {
  ++state.buckets;
  if (bucket.is_last()) ++state.last_buckets;
  return ddp::allreduce_hook(*state.group, bucket);
}

// Registers the scenario's hook (none for the plain all-reduce). Returns the counting state of
// custom-hook.
std::shared_ptr<CountingState> register_hook(ddp::DistributedDataParallel& model,
                                             const std::shared_ptr<ddp::comm::ProcessGroup>& group,
                                             const std::string& scenario) {
  if (scenario == "fp16") model->register_comm_hook(group, ddp::fp16_compress_hook);
  if (scenario == "bf16") model->register_comm_hook(group, ddp::bf16_compress_hook);
  if (scenario == "powersgd-warmup") {  // the plain all-reduce until iteration 100
    model->register_comm_hook(std::make_shared<ddp::PowerSGDState>(
                                  group, ddp::PowerSGDOptions().start_powerSGD_iter(100)),
                              ddp::powersgd_hook);
  }
  if (scenario != "custom-hook") return nullptr;
  auto state = std::make_shared<CountingState>(CountingState{group});
  model->register_comm_hook(state, counting_hook);
  return state;
}

int check_buffers(const std::shared_ptr<ddp::comm::ProcessGroup>& group, bool broadcast) {
  torch::manual_seed(100);
  torch::nn::Sequential net(torch::nn::Linear(kIn, kHidden), torch::nn::BatchNorm1d(kHidden),
                            torch::nn::ReLU(), torch::nn::Linear(kHidden, kOut));
  ddp::DistributedDataParallel model(
      net, group, ddp::DistributedDataParallelOptions().broadcast_buffers(broadcast));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  torch::manual_seed(static_cast<uint64_t>(group->rank()));  // different data on every rank
  for (int step = 0; step < 3; ++step) {
    model->zero_grad();
    torch::mse_loss(model->forward(torch::randn({kBatch, kIn})), torch::randn({kBatch, kOut}))
        .backward();
    optimizer.step();
  }
  model->pre_forward();
  double checksum = 0.0;
  for (const auto& b : net->buffers()) checksum += b.to(torch::kDouble).sum().item<double>();
  std::cout << fmt::format("rank {}/{}: buffer checksum {:.9f}\n", group->rank(),
                           group->world_size(), checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ddp_worker BACKEND SCENARIO\n";
    return 64;
  }
  const std::string backend = argv[1];
  const std::string scenario = argv[2];
  try {
    torch::set_num_threads(1);
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    ddp::comm::ProcessGroupOptions pg_options;
    pg_options.timeout = std::chrono::seconds(30);
    pg_options.rendezvous_timeout = std::chrono::seconds(30);
    std::shared_ptr<ddp::comm::ProcessGroup> group =
        ddp::comm::create_process_group(backend, launch, pg_options, false);
    const int world = group->world_size();
    const int rank = group->rank();
    if (scenario == "buffers" || scenario == "no-buffers")
      return check_buffers(group, scenario == "buffers");
    const bool with_unused = scenario == "unused" || scenario == "unused-find";
    const int64_t hidden = scenario == "mismatch" && rank == 1 ? kHidden + 1 : kHidden;

    // Each rank starts from its own initialisation: DDP must broadcast rank 0's.
    auto net = make_net(100 + static_cast<uint64_t>(rank), hidden, with_unused);
    auto reference = make_net(100, kHidden, with_unused);
    auto options = ddp::DistributedDataParallelOptions()
                       .bucket_cap_mb(1024.0 / (1 << 20))  // ~1 KB buckets: several per model
                       .first_bucket_mb(256.0 / (1 << 20))
                       .find_unused_parameters(scenario == "unused-find")
                       .gradient_as_bucket_view(scenario == "bucket-view");
    ddp::DistributedDataParallel model(net, group, options);
    const auto counting = register_hook(model, group, scenario);
    auto optimizer = make_optimizer(scenario, model->parameters());
    auto reference_optimizer = make_optimizer(scenario, reference->parameters());

    torch::manual_seed(7);
    const auto x = torch::randn({kSteps * world * kBatch, kIn});
    const auto y = torch::randn({kSteps * world * kBatch, kOut});
    const int micro = scenario == "nosync" ? 2 : 1;
    for (int64_t step = 0; step < kSteps; ++step) {
      const int64_t global = step * world * kBatch;
      // DDP: this rank's slice of the global batch, in `micro` micro-batches.
      model->zero_grad();
      for (int m = 0; m < micro; ++m) {
        const int64_t size = kBatch / micro;
        const auto rows = torch::arange(global + rank * kBatch + m * size,
                                        global + rank * kBatch + (m + 1) * size);
        auto run = [&] {
          torch::mse_loss(model->forward(x.index_select(0, rows)), y.index_select(0, rows))
              .backward();
        };
        if (m + 1 < micro) {
          auto guard = model->no_sync();
          run();
        } else {
          run();
        }
      }
      optimizer->step();
      // Reference: one process, the whole global batch in the same micro-batches.
      reference_optimizer->zero_grad();
      for (int m = 0; m < micro; ++m) {
        std::vector<torch::Tensor> parts;
        const int64_t size = kBatch / micro;
        for (int r = 0; r < world; ++r)
          parts.push_back(
              torch::arange(global + r * kBatch + m * size, global + r * kBatch + (m + 1) * size));
        const auto rows = torch::cat(parts);
        torch::mse_loss(reference->forward(x.index_select(0, rows)), y.index_select(0, rows))
            .backward();
      }
      reference_optimizer->step();
      if (scenario == "overlap" && step == 0) {
        const auto& stats = model->reducer().last_iteration();
        std::cout << fmt::format(
            "rank {}: {} buckets; first launched {} us before the last gradient\n", rank,
            stats.bucket_launch.size(),
            std::chrono::duration_cast<std::chrono::microseconds>(stats.last_grad -
                                                                  stats.bucket_launch.front())
                .count());
        for (size_t b = 1; b < stats.bucket_launch.size(); ++b) {
          if (stats.bucket_launch[b] < stats.bucket_launch[b - 1])
            std::cout << "OUT OF ORDER bucket " << b << "\n";
        }
      }
    }
    if (counting) {
      // Every bucket of every step went through the hook, and a second hook is refused.
      std::cout << fmt::format("rank {}: the hook reduced {} buckets, {} of them last\n", rank,
                               counting->buckets, counting->last_buckets);
      if (counting->last_buckets != kSteps || counting->buckets < kSteps) return 6;
      try {
        model->register_comm_hook(group, ddp::allreduce_hook);
        return 7;
      } catch (const ddp::Error& e) {
        std::cout << "second hook refused: " << e.what() << "\n";
      }
    }
    const double error = max_relative_error(net, reference);
    const double tolerance = scenario == "fp16" ? 2e-2 : scenario == "bf16" ? 5e-2 : 1e-5;
    std::cout << fmt::format(
        "rank {}/{}: {} buckets{}, max relative error {:.3g} (tolerance {:.0e})\n", rank, world,
        model->reducer().buckets().size(), model->reducer().rebuilt() ? " (rebuilt)" : "", error,
        tolerance);
    return error <= tolerance ? 0 : 4;
  } catch (const ddp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cout << "exception: " << e.what() << std::endl;
    return 5;
  }
}
