// One rank of the multi-process DistributedDataParallel tests (test_ddp.cpp). Trains a small
// model for 5 steps with DDP, per-rank batch B, and, in the same process, the same model without
// DDP on the global batch of world * B samples; a scenario passes (exit 0) only if the parameters
// agree.
//   ddp_worker BACKEND SCENARIO...   each SCENARIO in turn on one process group, its lines
//                                    prefixed "[SCENARIO] " (support/scenario_runner.h); exits 0
//                                    only if every one passed
// SCENARIO: sgd | nosync | adam | fp16 | bf16 | custom-hook | powersgd-warmup | bucket-view |
//           unused | unused-find | mismatch | overlap | buffers | no-buffers | two-forwards |
//           checkpoint-twice | checkpoint-twice-dynamic | grad-scaler | zero | clip=RECORD |
//           signatures | diloco=REFERENCE.pt
//   diloco: rank r replays worker r of tests/python/diloco_reference.py through ddp::DiLoCo
//       (DiLoCo, local SGD, DiLoCo with a delay) and checks every synchronization's parameters
//       against the reference's to 1e-6
//   bucket-view on shm: every .grad also lies in the group's shared memory (DDP's buckets are
//       carved from the group's buffers)
//   clip: the reduced gradients clipped to a 2-norm of kMaxNorm before each step; rank 0 writes
//       the first step's before and after, and the norm, to RECORD (for
//       tests/python/clip_check.py).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/activation_checkpoint.h"
#include "ddp/core/diloco.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/grad_scaler.h"
#include "ddp/core/powersgd.h"
#include "ddp/core/zero_redundancy_optimizer.h"
#include "ddp/train/pt_file.h"
#include "diloco_reference.h"
#include "scenario_runner.h"
#include "shared_segments.h"
#include "tensor_compare.h"

namespace ddp_worker {

namespace {

using ddp::testing::max_relative_error;

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

// The clip scenario's clipping (ddp_train --clip-grad-norm's call), recorded into `record` unless
// it is empty: {"grad.<i>", "clipped.<i>", "norm", "max_norm"}.
constexpr double kMaxNorm = 0.1;
void clip_gradients(const std::vector<torch::Tensor>& params, const std::string& record) {
  if (record.empty()) {
    torch::nn::utils::clip_grad_norm_(params, kMaxNorm);
    return;
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (size_t i = 0; i < params.size(); ++i)
    out.insert(fmt::format("grad.{}", i), params[i].grad().clone());
  const double norm = torch::nn::utils::clip_grad_norm_(params, kMaxNorm);
  for (size_t i = 0; i < params.size(); ++i)
    out.insert(fmt::format("clipped.{}", i), params[i].grad().clone());
  out.insert("norm", torch::tensor(norm, torch::kDouble));
  out.insert("max_norm", torch::tensor(kMaxNorm, torch::kDouble));
  ddp::train::write_pt_file(record, out);
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
template <class M>
std::shared_ptr<CountingState> register_hook(ddp::DistributedDataParallel<M>& model,
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

// A block used twice between a head and a tail; checkpointed, each use's backward runs again
// inside the outer backward, so the block's parameters get two gradients per backward.
struct TwiceImpl : torch::nn::Module {
  TwiceImpl() {
    head = register_module("head", torch::nn::Linear(kIn, kHidden));
    block = register_module("block", torch::nn::Linear(kHidden, kHidden));
    tail = register_module("tail", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x, bool checkpointed) {
    const ddp::CheckpointedFn run = [this](const torch::Tensor& h) {
      return torch::tanh(block(h));
    };
    auto h = torch::relu(head(x));
    for (int use = 0; use < 2; ++use) h = checkpointed ? ddp::checkpoint(run, h) : run(h);
    return tail(h);
  }
  torch::nn::Linear head{nullptr}, block{nullptr}, tail{nullptr};
};
TORCH_MODULE(Twice);

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// Rank `rank`'s loss at `step`: the sum over its `forwards` batches of their mean squared error,
// one forward each (the data drawn from a seed of step, rank and forward).
torch::Tensor rank_loss(const Forward& forward, int rank, int64_t step, int forwards) {
  torch::Tensor loss;
  for (int f = 0; f < forwards; ++f) {
    torch::manual_seed(static_cast<uint64_t>(1000 * step + 10 * rank + f));
    const auto x = torch::randn({kBatch, kIn});
    const auto y = torch::randn({kBatch, kOut});
    const auto l = torch::mse_loss(forward(x), y);
    loss = loss.defined() ? loss + l : l;
  }
  return loss;
}

// two-forwards: a model with BatchNorm and buffer broadcast, two forwards then one backward (a
// siamese step; PyTorch 1.13's DDP fails it: its second broadcast invalidates the first forward's
// saved running statistics). checkpoint-twice[-dynamic]: TwiceImpl checkpointed, with (and
// without) static_graph. The reference is one process running every rank's forwards and
// averaging the ranks' losses; BatchNorm normalises each forward's batch alone in both.
int check_graph(const std::shared_ptr<ddp::comm::ProcessGroup>& group,
                const std::string& scenario) {
  const int world = group->world_size(), rank = group->rank();
  const bool bn = scenario == "two-forwards";
  auto make = [&](uint64_t seed,
                  bool checkpointed) -> std::pair<std::shared_ptr<torch::nn::Module>, Forward> {
    torch::manual_seed(seed);
    if (bn) {
      torch::nn::Sequential seq(torch::nn::Linear(kIn, kHidden), torch::nn::BatchNorm1d(kHidden),
                                torch::nn::ReLU(), torch::nn::Linear(kHidden, kOut));
      return {seq.ptr(), [seq](const torch::Tensor& x) mutable { return seq->forward(x); }};
    }
    Twice twice;
    return {twice.ptr(), [twice, checkpointed](const torch::Tensor& x) mutable {
              return twice->forward(x, checkpointed);
            }};
  };
  // Each rank starts from its own initialisation (DDP broadcasts rank 0's); the reference is the
  // plain model, not checkpointed.
  // Not a structured binding: the lambda below captures net_forward, which C++17 allows only
  // for a variable (GCC accepts it anyway, clang does not).
  auto [net, net_forward_of] = make(100 + static_cast<uint64_t>(rank), true);
  Forward net_forward = std::move(net_forward_of);
  auto [reference, reference_forward] = make(100, false);
  ddp::DistributedDataParallel model(net, group,
                                     ddp::DistributedDataParallelOptions()
                                         .bucket_cap_mb(1024.0 / (1 << 20))
                                         .first_bucket_mb(256.0 / (1 << 20))
                                         .static_graph(scenario == "checkpoint-twice"));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(0.1).momentum(0.9));
  const Forward ours = [&](const torch::Tensor& x) {
    return model->forward_with([&] { return net_forward(x); });
  };
  const int forwards = bn ? 2 : 1;
  for (int64_t step = 0; step < kSteps; ++step) {
    model->zero_grad();
    rank_loss(ours, rank, step, forwards).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::Tensor total = rank_loss(reference_forward, 0, step, forwards);
    for (int r = 1; r < world; ++r) total = total + rank_loss(reference_forward, r, step, forwards);
    (total / world).backward();
    reference_optimizer.step();
  }
  const double error = max_relative_error(net->parameters(), reference->parameters());
  std::cout << fmt::format("rank {}/{}: {} buckets, max relative error {:.3g} (tolerance 1e-05)\n",
                           rank, world, model->reducer().buckets().size(), error);
  return error <= 1e-5 ? 0 : 4;
}

// grad-scaler: GradScaler (scale 1024, growth every 2 clean steps) over DDP. At step 0 the last
// rank alone finds an inf in its reduced gradients: every rank skips that step and halves the
// scale; the 4 clean steps after it double the scale twice. The reference, one process without
// scaling, skips step 0 too (scaling by powers of two is exact).
int check_grad_scaler(const std::shared_ptr<ddp::comm::ProcessGroup>& group) {
  const int world = group->world_size(), rank = group->rank();
  auto net = make_net(100 + static_cast<uint64_t>(rank), kHidden, false);
  auto reference = make_net(100, kHidden, false);
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::amp::GradScaler scaler(group,
                              ddp::amp::GradScalerOptions().init_scale(1024).growth_interval(2));
  const Forward ours = [&](const torch::Tensor& x) { return model->forward(x); };
  const Forward theirs = [&](const torch::Tensor& x) { return reference->forward(x); };
  std::vector<std::string> log;
  for (int64_t step = 0; step < kSteps; ++step) {
    model->zero_grad();
    scaler.scale(rank_loss(ours, rank, step, 1)).backward();
    if (step == 0 && rank == world - 1) net->a->weight.mutable_grad()[0][0] = INFINITY;
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    log.push_back(fmt::format("{}:{}", stepped ? "step" : "skip", scaler.get_scale()));
    if (step == 0) continue;
    reference_optimizer.zero_grad();
    torch::Tensor total = rank_loss(theirs, 0, step, 1);
    for (int r = 1; r < world; ++r) total = total + rank_loss(theirs, r, step, 1);
    (total / world).backward();
    reference_optimizer.step();
  }
  const double error = max_relative_error(net->parameters(), reference->parameters());
  const std::string steps = fmt::format("{}", fmt::join(log, " "));
  std::cout << fmt::format("rank {}/{}: {}, max relative error {:.3g} (tolerance 1e-05)\n", rank,
                           world, steps, error);
  return error <= 1e-5 && steps == "skip:512 step:512 step:1024 step:1024 step:2048" ? 0 : 4;
}

// zero: ZeroRedundancyOptimizer with Adam over DDP for 20 steps against one process with plain
// Adam on the global batch. Prints the rank's share of the optimizer state.
int check_zero(const std::shared_ptr<ddp::comm::ProcessGroup>& group) {
  const int world = group->world_size(), rank = group->rank();
  auto net = make_net(100 + static_cast<uint64_t>(rank), kHidden, false);
  auto reference = make_net(100, kHidden, false);
  ddp::DistributedDataParallel model(net, group);
  auto adam = [](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
  };
  ddp::ZeroRedundancyOptimizer optimizer(model->parameters(), group, adam);
  auto reference_optimizer = adam(reference->parameters());
  const Forward ours = [&](const torch::Tensor& x) { return model->forward(x); };
  const Forward theirs = [&](const torch::Tensor& x) { return reference->forward(x); };
  constexpr int64_t kZeroSteps = 20;
  for (int64_t step = 0; step < kZeroSteps; ++step) {
    optimizer.zero_grad();
    rank_loss(ours, rank, step, 1).backward();
    optimizer.step();
    reference_optimizer->zero_grad();
    torch::Tensor total = rank_loss(theirs, 0, step, 1);
    for (int r = 1; r < world; ++r) total = total + rank_loss(theirs, r, step, 1);
    (total / world).backward();
    reference_optimizer->step();
  }
  int64_t mine = 0, all = 0;
  for (size_t i = 0; i < optimizer.owners().size(); ++i) {
    all += net->parameters()[i].numel();
    if (optimizer.owners()[i] == rank) mine += net->parameters()[i].numel();
  }
  const double error = max_relative_error(net->parameters(), reference->parameters());
  std::cout << fmt::format(
      "rank {}/{}: owns {} of {} parameter elements, optimizer state {} bytes, max relative "
      "error {:.3g} (tolerance 1e-05)\n",
      rank, world, mine, all, optimizer.local_state_bytes(), error);
  return error <= 1e-5 ? 0 : 4;
}

// signatures: forwards that are not Tensor -> Tensor, called as model->forward(...). PairNet, a
// plain struct in a std::shared_ptr, takes two tensors and returns a tuple; RepeatNet, a
// TORCH_MODULE, takes a tensor and an int (how often its block runs).
struct PairNet : torch::nn::Module {
  PairNet() {
    left = register_module("left", torch::nn::Linear(kIn, kHidden));
    right = register_module("right", torch::nn::Linear(kIn, kHidden));
    head = register_module("head", torch::nn::Linear(kHidden, kOut));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& a, const torch::Tensor& b) {
    const auto h = torch::relu(left(a) + right(b));
    return {head(h), h.mean(1)};
  }
  torch::nn::Linear left{nullptr}, right{nullptr}, head{nullptr};
};

struct RepeatNetImpl : torch::nn::Module {
  RepeatNetImpl() {
    in = register_module("in", torch::nn::Linear(kIn, kHidden));
    block = register_module("block", torch::nn::Linear(kHidden, kHidden));
    out = register_module("out", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x, int64_t times) {
    auto h = torch::relu(in(x));
    for (int64_t i = 0; i < times; ++i) h = torch::tanh(block(h));
    return out(h);
  }
  torch::nn::Linear in{nullptr}, block{nullptr}, out{nullptr};
};
TORCH_MODULE(RepeatNet);

// DDP over make()'s module, called through `call(module, x)`, against one process on the global
// batch; returns the largest relative difference of the parameters after kSteps.
template <class Make, class Call>
double signature_error(const std::shared_ptr<ddp::comm::ProcessGroup>& group, Make make,
                       Call call) {
  const int world = group->world_size(), rank = group->rank();
  torch::manual_seed(100 + static_cast<uint64_t>(rank));
  auto net = make();
  torch::manual_seed(100);
  auto reference = make();
  ddp::DistributedDataParallel model(net, group);  // DistributedDataParallel<PairNet>, ...
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(0.1).momentum(0.9));
  const Forward ours = [&](const torch::Tensor& x) { return call(*model, x); };
  const Forward theirs = [&](const torch::Tensor& x) { return call(*reference, x); };
  for (int64_t step = 0; step < kSteps; ++step) {
    model->zero_grad();
    rank_loss(ours, rank, step, 1).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::Tensor total = rank_loss(theirs, 0, step, 1);
    for (int r = 1; r < world; ++r) total = total + rank_loss(theirs, r, step, 1);
    (total / world).backward();
    reference_optimizer.step();
  }
  return max_relative_error(net->parameters(), reference->parameters());
}

int check_signatures(const std::shared_ptr<ddp::comm::ProcessGroup>& group) {
  const double pair = signature_error(
      group, [] { return std::make_shared<PairNet>(); },
      [](auto& module, const torch::Tensor& x) {
        auto [out, aux] = module.forward(x, x.flip(1));
        return out + 0.1 * aux.unsqueeze(1);
      });
  const double repeat = signature_error(
      group, [] { return RepeatNet(); },
      [](auto& module, const torch::Tensor& x) { return module.forward(x, 2); });
  std::cout << fmt::format(
      "rank {}/{}: forward(Tensor, Tensor) -> tuple max relative error {:.3g}, forward(Tensor, "
      "int) {:.3g} (tolerance 1e-05)\n",
      group->rank(), group->world_size(), pair, repeat);
  return pair <= 1e-5 && repeat <= 1e-5 ? 0 : 4;
}

// This rank replays worker `rank` of the reference: its inner steps on its own batches, then
// DiLoCo's synchronization (an all-reduce among the real ranks); every round's global parameters
// must be the reference's.
int check_diloco(const std::shared_ptr<ddp::comm::ProcessGroup>& group, const std::string& file) {
  namespace ref = ddp::testing::diloco;
  const auto reference = ref::read_reference(file);
  double worst = 0;
  int rounds = 0;
  for (const auto& [variant, options] :
       {std::pair{std::string("diloco"), ddp::DiLoCoOptions{ref::kH, 0.7, 0.9, true}},
        std::pair{std::string("local_sgd"), ddp::DiLoCoOptions::local_sgd(ref::kH)},
        std::pair{std::string("diloco_delayed"),
                  ddp::DiLoCoOptions{ref::kH, 0.7, 0.9, true, ref::kDelay}}}) {
    std::vector<at::Tensor> w = {reference.at("W0").clone(), reference.at("b0").clone()};
    ddp::DiLoCo diloco(w, group, options);
    int round = 0;
    for (int s = 0; s < ref::kRounds * ref::kH; ++s) {
      ref::inner_step(w, reference, group->rank(), s);
      if (diloco.after_inner_step()) {
        // Without a delay the model is the global parameters; with one, its own progress of the
        // delayed steps is on top of them.
        const double error = ref::round_error(options.delay == 0 ? w : diloco.global_parameters(),
                                              reference, variant, round++);
        worst = std::max(worst, error);
        std::cout << fmt::format("rank {}: {} round {}: max error {:.3g}", group->rank(), variant,
                                 round, error)
                  << std::endl;
      }
    }
    rounds += round;
  }
  return worst <= 1e-6 && rounds == 3 * ref::kRounds ? 0 : 4;
}

// The sgd family: DDP with `scenario`'s options against one process on the global batch.
int check_training(const std::shared_ptr<ddp::comm::ProcessGroup>& group,
                   const std::string& scenario, const std::string& record) {
  const int world = group->world_size();
  const int rank = group->rank();
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
      const auto rows =
          torch::arange(global + rank * kBatch + m * size, global + rank * kBatch + (m + 1) * size);
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
    if (scenario == "clip") {
      clip_gradients(model->parameters(), step == 0 && rank == 0 ? record : "");
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
    if (scenario == "clip") clip_gradients(reference->parameters(), "");
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
  if (scenario == "bucket-view" && group->backend_name() == "shm") {
    // On shm, DDP carves its buckets from the group's buffers (ProcessGroup::allocate_buffer),
    // and gradient_as_bucket_view makes each .grad a view of its bucket.
    const auto params = net->parameters();
    const auto shared = std::count_if(params.begin(), params.end(), [](const torch::Tensor& p) {
      return ddp::testing::in_shared_segment(p.grad().data_ptr());
    });
    std::cout << fmt::format("rank {}: {} of {} gradients in the group's shared memory\n", rank,
                             shared, params.size());
    if (shared != static_cast<std::ptrdiff_t>(params.size())) return 8;
  }
  const double error = max_relative_error(net->parameters(), reference->parameters());
  const double tolerance = scenario == "fp16" ? 2e-2 : scenario == "bf16" ? 5e-2 : 1e-5;
  std::cout << fmt::format(
      "rank {}/{}: {} buckets{}, max relative error {:.3g} (tolerance {:.0e})\n", rank, world,
      model->reducer().buckets().size(), model->reducer().rebuilt() ? " (rebuilt)" : "", error,
      tolerance);
  return error <= tolerance ? 0 : 4;
}

// One scenario on `group`; `argument` is the word after '=' (clip's record, diloco's reference).
int run_scenario(const std::shared_ptr<ddp::comm::ProcessGroup>& group, const std::string& scenario,
                 const std::string& argument) {
  if (scenario == "buffers" || scenario == "no-buffers")
    return check_buffers(group, scenario == "buffers");
  if (scenario == "grad-scaler") return check_grad_scaler(group);
  if (scenario == "zero") return check_zero(group);
  if (scenario == "diloco") return check_diloco(group, argument);
  if (scenario == "signatures") return check_signatures(group);
  if (scenario == "two-forwards" || scenario.rfind("checkpoint-twice", 0) == 0)
    return check_graph(group, scenario);
  return check_training(group, scenario, argument);
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ddp_worker BACKEND SCENARIO...\n";
    return 64;
  }
  const std::string backend = argv[1];
  try {
    torch::set_num_threads(1);
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    ddp::comm::ProcessGroupOptions pg_options;
    pg_options.timeout = std::chrono::seconds(30);
    pg_options.rendezvous_timeout = std::chrono::seconds(30);
    std::shared_ptr<ddp::comm::ProcessGroup> group =
        ddp::comm::create_process_group(backend, launch, pg_options, false);
    return ddp::testing::run_scenarios(
        std::vector<std::string>(argv + 2, argv + argc), group->rank(),
        [&](const std::string& scenario, const std::string& argument) {
          return run_scenario(group, scenario, argument);
        },
        [&] { group->barrier()->wait(); });
  } catch (const ddp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cout << "exception: " << e.what() << std::endl;
    return 5;
  }
}

}  // namespace ddp_worker
