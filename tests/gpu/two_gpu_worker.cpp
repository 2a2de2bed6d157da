// One rank of the GPU tests (test_two_gpus.cpp, test_shared_gpu.cpp), started with the env
// contract, on cuda:LOCAL_RANK with nccl (one GPU a rank), or on gloo, whose ranks may share a GPU
// (cuda:LOCAL_RANK % GPUs; gloo takes CUDA tensors through host copies). Exits 0 only if every
// check holds; prints "rank R/W on cuda:D: ..." so that the test can tell which rank said what.
//   two_gpu_worker collectives [nccl|gloo]   every collective against its closed form
//   two_gpu_worker ddp [nccl|gloo]           DistributedDataParallel against one process with the
//                                            whole batch
//   two_gpu_worker grad-scaler [nccl|gloo]   fp16 autocast and GradScaler over DDP, an inf on one
//                                            rank skipping the step on all
// The CPU backends' workers (tests/integration) prove the same closed forms on gloo and MPI with
// CPU tensors; NCCL refuses two ranks on one GPU, so only two GPUs run it at world size 2.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/autocast.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/grad_scaler.h"
#include "tensor_compare.h"

namespace two_gpu_worker {

namespace {

using ddp::testing::max_relative_error;

using ddp::comm::ProcessGroup;
using ddp::comm::ReduceOp;
using Clock = std::chrono::steady_clock;

// Counts checks and prints each failure; the exit code is the verdict.
struct Checks {
  int run = 0;
  int failed = 0;

  void expect(bool ok, const std::string& what) {
    ++run;
    if (ok) return;
    ++failed;
    std::cout << "MISMATCH " << what << std::endl;
  }
  // `got` may live on the GPU; .cpu() waits on the current stream, which Work::wait() ordered
  // after the collective, so a missing wait shows up here as a wrong value.
  void equal(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
    const auto host = got.cpu();
    if (host.scalar_type() == want.scalar_type() && torch::equal(host, want)) {
      expect(true, what);
      return;
    }
    const auto diff = (host.to(torch::kDouble) - want.to(torch::kDouble)).abs().max();
    expect(false, fmt::format("{}: {} against {}, max abs diff {}", what,
                              c10::toString(host.scalar_type()), c10::toString(want.scalar_type()),
                              diff.item<double>()));
  }
};

bool is_16_bit(torch::ScalarType dtype) {
  return dtype == torch::kHalf || dtype == torch::kBFloat16;
}

// Element i is i % 97 (16-bit dtypes: (i % 7) / 2), in double: every value the checks derive from
// it (sums of two ranks, averages, shifts by a rank) is exact in every dtype tested, so results
// compare bitwise. Converted to the dtype only at the end, on the CPU.
torch::Tensor pattern(int64_t n, torch::ScalarType dtype) {
  const auto i = torch::arange(n, torch::kLong);
  return is_16_bit(dtype) ? i.remainder(7).to(torch::kDouble).mul(0.5)
                          : i.remainder(97).to(torch::kDouble);
}

torch::Tensor on(const torch::Tensor& values, torch::ScalarType dtype, torch::Device device) {
  return values.to(dtype).to(device);
}

// The ranks' blocks q = 0..w-1, each `block(q)`, end to end.
torch::Tensor blocks_of(int w, const std::function<torch::Tensor(int)>& block) {
  std::vector<torch::Tensor> blocks;
  for (int q = 0; q < w; ++q) blocks.push_back(block(q));
  return torch::cat(blocks);
}

// all_reduce: rank r holds base * (r + 1) for sum, base * 2 (r + 1) for avg (so that the average,
// base * (w + 1), is exact in integers too), base + r for min and max.
void check_all_reduce(ProcessGroup& pg, torch::Device device, torch::ScalarType dtype, int64_t n,
                      Checks& checks) {
  const int w = pg.world_size(), r = pg.rank();
  const double sum_of_ranks = w * (w + 1) / 2.0;  // of (r + 1)
  const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
  const auto base = pattern(n, dtype);
  auto t = on(base * (r + 1), dtype, device);
  pg.all_reduce(t, ReduceOp::kSum)->wait();
  checks.equal(t, (base * sum_of_ranks).to(dtype), "all_reduce(sum) " + tag);
  t = on(base * 2 * (r + 1), dtype, device);
  pg.all_reduce(t, ReduceOp::kAvg)->wait();
  checks.equal(t, (base * (w + 1)).to(dtype), "all_reduce(avg) " + tag);
  t = on(base + r, dtype, device);
  pg.all_reduce(t, ReduceOp::kMin)->wait();
  checks.equal(t, base.to(dtype), "all_reduce(min) " + tag);
  t = on(base + r, dtype, device);
  pg.all_reduce(t, ReduceOp::kMax)->wait();
  checks.equal(t, (base + (w - 1)).to(dtype), "all_reduce(max) " + tag);
}

// broadcast from the last rank (not 0: a root mix-up shows) of a seeded random tensor, onto
// zeros; all_gather of base + r, rank q's block at offset q * n.
void check_data_movement(ProcessGroup& pg, torch::Device device, torch::ScalarType dtype, int64_t n,
                         Checks& checks) {
  const int w = pg.world_size(), r = pg.rank();
  const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
  auto gen = at::detail::createCPUGenerator(1234 + static_cast<uint64_t>(n));
  const auto seeded = at::randint(-1000, 1000, {n}, gen, at::TensorOptions(at::kLong)).to(dtype);
  auto t = r == w - 1 ? seeded.to(device) : torch::zeros({n}, seeded.options().device(device));
  pg.broadcast(t, w - 1)->wait();
  checks.equal(t, seeded, "broadcast " + tag);

  const auto base = pattern(n, dtype);
  auto out = torch::full({n * w}, -1, torch::TensorOptions(dtype).device(device));
  pg.all_gather(out, on(base + r, dtype, device))->wait();
  checks.equal(out, blocks_of(w, [&](int q) { return base + q; }).to(dtype), "all_gather " + tag);
}

// reduce_scatter: rank r's block q is (base + q) * (r + 1) for sum, twice that for avg, base + q
// + r for max; rank r receives the reduction of the blocks r.
void check_reduce_scatter(ProcessGroup& pg, torch::Device device, torch::ScalarType dtype,
                          int64_t n, Checks& checks) {
  const int w = pg.world_size(), r = pg.rank();
  const double sum_of_ranks = w * (w + 1) / 2.0;
  const std::string tag = fmt::format("{} block={}", c10::toString(dtype), n);
  const auto base = pattern(n, dtype);
  const auto scaled = blocks_of(w, [&](int q) { return (base + q) * (r + 1); });
  const auto shifted = blocks_of(w, [&](int q) { return base + q + r; });
  auto out = torch::empty({n}, torch::TensorOptions(dtype).device(device));
  pg.reduce_scatter(out, on(scaled, dtype, device), ReduceOp::kSum)->wait();
  checks.equal(out, ((base + r) * sum_of_ranks).to(dtype), "reduce_scatter(sum) " + tag);
  pg.reduce_scatter(out, on(scaled * 2, dtype, device), ReduceOp::kAvg)->wait();
  checks.equal(out, ((base + r) * (w + 1)).to(dtype), "reduce_scatter(avg) " + tag);
  pg.reduce_scatter(out, on(shifted, dtype, device), ReduceOp::kMax)->wait();
  checks.equal(out, (base + r + (w - 1)).to(dtype), "reduce_scatter(max) " + tag);
}

// The barrier holds every rank until the last arrives: after a first barrier lines the ranks up,
// the last rank comes 500 ms late to a second, and rank 0 must not leave it much before then (the
// slack covers the ranks' different exits from the first). Each barrier is one collective.
void check_barrier(ProcessGroup& pg, Checks& checks) {
  const auto late = std::chrono::milliseconds(500);
  pg.barrier()->wait();
  const uint64_t before = pg.last_seq();
  const auto start = Clock::now();
  if (pg.rank() == pg.world_size() - 1) std::this_thread::sleep_for(late);
  pg.barrier()->wait();
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  checks.expect(pg.last_seq() == before + 1, "a barrier is one collective");
  if (pg.rank() == 0) {
    checks.expect(waited >= 400, fmt::format("rank 0 left the barrier after {} ms, before the "
                                             "rank that came 500 ms late",
                                             waited));
  }
}

// A tensor on the other rank's GPU is refused before anything is sent (both ranks try, so the
// sequence numbers stay in step).
void check_rejects_the_other_gpu(ProcessGroup& pg, torch::Device device, Checks& checks) {
  const int other = (device.index() + 1) % 2;
  auto t = torch::ones({3}, torch::TensorOptions(torch::kFloat).device(torch::kCUDA, other));
  std::string what = "accepted";
  try {
    pg.all_reduce(t);
  } catch (const ddp::InputError& e) {
    what = e.what();
  }
  checks.expect(what.find(fmt::format("needs CUDA tensors on {}; got a tensor tensor on cuda:{}",
                                      device.str(), other)) != std::string::npos,
                "a tensor on cuda:" + std::to_string(other) + ": " + what);
}

int check_collectives(ProcessGroup& pg, torch::Device device) {
  Checks checks;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kLong, torch::kHalf, torch::kBFloat16}) {
    // Up to 3,000,003 elements: several of NCCL's chunks, and not a multiple of any of them.
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 20, int64_t{3000003}}) {
      check_all_reduce(pg, device, dtype, n, checks);
      check_data_movement(pg, device, dtype, n, checks);
      check_reduce_scatter(pg, device, dtype, n, checks);
    }
  }
  check_barrier(pg, checks);
  if (pg.backend_name() == "nccl") check_rejects_the_other_gpu(pg, device, checks);
  std::cout << fmt::format("rank {}/{} on {}: {} checks, {} failures", pg.rank(), pg.world_size(),
                           device.str(), checks.run, checks.failed)
            << std::endl;
  return checks.failed == 0 ? 0 : 3;
}

constexpr int64_t kIn = 16, kHidden = 64, kOut = 4, kBatch = 8, kSteps = 5;

torch::nn::Sequential make_net(uint64_t seed, torch::Device device) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(torch::nn::Linear(kIn, kHidden), torch::nn::ReLU(),
                            torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU(),
                            torch::nn::Linear(kHidden, kOut));
  net->to(device);
  return net;
}

// DDP on this rank's GPU with batch kBatch against, in the same process and on the same GPU, the
// plain model on the global batch of world * kBatch rows: after kSteps of SGD with momentum the
// parameters agree to float rounding (cuBLAS keeps float32 matmuls in float32: LibTorch's
// allow_tf32 for matmuls is off by default). Each rank starts from its own initialisation: DDP
// must broadcast rank 0's. Buckets of 4 KiB: several per step, reduced while backward runs.
int check_ddp(const std::shared_ptr<ProcessGroup>& group, torch::Device device) {
  const int world = group->world_size(), rank = group->rank();
  auto net = make_net(100 + static_cast<uint64_t>(rank), device);
  auto reference = make_net(100, device);
  ddp::DistributedDataParallel model(
      net, group,
      ddp::DistributedDataParallelOptions().bucket_cap_mb(4.0 / 1024).first_bucket_mb(1.0 / 1024));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD reference_optimizer(reference->parameters(),
                                        torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(7);
  const auto x = torch::randn({kSteps * world * kBatch, kIn}).to(device);
  const auto y = torch::randn({kSteps * world * kBatch, kOut}).to(device);
  for (int64_t step = 0; step < kSteps; ++step) {
    const int64_t global = step * world * kBatch;
    model->zero_grad();
    const auto mine = x.narrow(0, global + rank * kBatch, kBatch);
    torch::mse_loss(model->forward(mine), y.narrow(0, global + rank * kBatch, kBatch)).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::mse_loss(reference->forward(x.narrow(0, global, world * kBatch)),
                    y.narrow(0, global, world * kBatch))
        .backward();
    reference_optimizer.step();
  }
  const bool on_gpu = net->parameters().front().device() == device;
  const double error = max_relative_error(net->parameters(), reference->parameters());
  std::cout << fmt::format(
                   "rank {}/{} on {}: parameters on {}, {} buckets, max relative error {:.3g} "
                   "(tolerance 1e-05)",
                   rank, world, device.str(), net->parameters().front().device().str(),
                   model->reducer().buckets().size(), error)
            << std::endl;
  return on_gpu && error <= 1e-5 ? 0 : 4;
}

torch::Tensor flat(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> views;
  for (const auto& p : parameters) views.push_back(p.detach().reshape({-1}));
  return torch::cat(views);
}

// fp16 autocast on the GPU and GradScaler (scale 1024, growth every 2 clean steps) over DDP. At
// step 0 the last rank alone puts an inf into its reduced gradients: every rank must skip that
// step (its parameters unchanged) and halve the scale, as the scaler all-reduces what it found;
// the 4 clean steps after it double the scale twice. The ranks end with the same parameters.
int check_grad_scaler(const std::shared_ptr<ProcessGroup>& group, torch::Device device) {
  const int world = group->world_size(), rank = group->rank();
  auto net = make_net(100 + static_cast<uint64_t>(rank), device);
  ddp::DistributedDataParallel model(net, group);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::amp::GradScaler scaler(group,
                              ddp::amp::GradScalerOptions().init_scale(1024).growth_interval(2));
  torch::manual_seed(7);
  const auto x = torch::randn({kSteps * world * kBatch, kIn}).to(device);
  const auto y = torch::randn({kSteps * world * kBatch, kOut}).to(device);
  const auto broadcast = flat(net->parameters()).clone();  // rank 0's, after DDP's broadcast
  std::vector<std::string> log;
  bool skipped_unchanged = false;
  for (int64_t step = 0; step < kSteps; ++step) {
    model->zero_grad();
    const int64_t at = (step * world + rank) * kBatch;
    torch::Tensor loss;
    {
      ddp::amp::Autocast autocast(torch::kCUDA, torch::kHalf);
      loss = torch::mse_loss(model->forward(x.narrow(0, at, kBatch)), y.narrow(0, at, kBatch));
    }
    scaler.scale(loss).backward();
    if (step == 0 && rank == world - 1) net->parameters().front().mutable_grad()[0][0] = INFINITY;
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    log.push_back(fmt::format("{}:{}", stepped ? "step" : "skip", scaler.get_scale()));
    if (step == 0) skipped_unchanged = torch::equal(flat(net->parameters()), broadcast);
  }
  const auto mine = flat(net->parameters());
  auto average = mine.clone();
  group->all_reduce(average, ReduceOp::kAvg)->wait();
  const bool same = torch::allclose(average, mine, 1e-6, 0.0);
  const bool finite = torch::isfinite(mine).all().item<bool>();
  const std::string steps = fmt::format("{}", fmt::join(log, " "));
  std::cout << fmt::format(
                   "rank {}/{} on {}: {}; step 0 left the parameters {}; the ranks' parameters "
                   "{}; {}",
                   rank, world, device.str(), steps, skipped_unchanged ? "unchanged" : "CHANGED",
                   same ? "agree" : "DIFFER", finite ? "finite" : "NOT FINITE")
            << std::endl;
  const bool ok = steps == "skip:512 step:512 step:1024 step:1024 step:2048" &&
                  skipped_unchanged && same && finite;
  return ok ? 0 : 4;
}

}  // namespace

int run(int argc, char** argv) {
  const std::string backend = argc == 3 ? argv[2] : "nccl";
  if ((argc != 2 && argc != 3) || (backend != "nccl" && backend != "gloo")) {
    std::cerr << "usage: two_gpu_worker collectives|ddp|grad-scaler [nccl|gloo]\n";
    return 64;
  }
  const std::string scenario = argv[1];
  try {
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    const int gpus = static_cast<int>(torch::cuda::device_count());
    const int index = backend == "gloo" && gpus > 0 ? launch.local_rank % gpus : launch.local_rank;
    const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
    ddp::comm::ProcessGroupOptions options;
    options.timeout = std::chrono::seconds(60);
    options.rendezvous_timeout = std::chrono::seconds(60);
    std::shared_ptr<ProcessGroup> group =
        ddp::comm::create_process_group(backend, launch, options, /*cuda_device=*/true);
    if (scenario == "collectives") return check_collectives(*group, device);
    if (scenario == "ddp") return check_ddp(group, device);
    if (scenario == "grad-scaler") return check_grad_scaler(group, device);
    std::cerr << "two_gpu_worker: unknown scenario '" << scenario << "'\n";
    return 64;
  } catch (const ddp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cout << "exception: " << e.what() << std::endl;
    return 5;
  }
}

}  // namespace two_gpu_worker
