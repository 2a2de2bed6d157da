// ddp_bench_allreduce: all-reduce time and bandwidth per message size, like nccl-tests'
// all_reduce_perf. Start it as the ranks of a job (mpirun, the launcher, or the env contract):
//   mpirun -np 2 build/ddp_bench_allreduce --backend mpi
// Prints, on rank 0, one row per size: bytes, elements, time (us), algbw and busbw (GB/s),
// where busbw = algbw * 2 (n - 1) / n is comparable across world sizes, the time of one memcpy of
// the same bytes on rank 0 alone (this machine's memory bandwidth, for the shm backend), and the
// slowest rank's when every rank runs that memcpy at once (memcpy-all: they share the memory bus).
// --buffers all-reduces buffers the group allocated (ProcessGroup::allocate_buffer), as DDP's
// buckets are: on shm, in place. --op all-gather or reduce-scatter times that collective instead
// (bytes: the gathered tensor's, the reduce-scatter's input; busbw = algbw (n - 1) / n), with
// --buffers the gathered tensor or the scattered input in the group's buffer, as FSDP's units'.
// --average: the all-reduce or reduce-scatter averages (ReduceOp::kAvg, DDP's default hook's)
// instead of summing.
// TORCH_DISTRIBUTED_DEBUG=DETAIL checks each all-reduce across the ranks first
// (ddp/comm/diagnostics/collective_check.h), as in ddp_train.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <cxxopts.hpp>
#include <functional>
#include <vector>
#include <iostream>

#include "ddp/comm/diagnostics/collective_check.h"
#include "ddp/comm/rendezvous.h"

namespace {

struct Row {
  int64_t bytes;
  int64_t count;
  double seconds;
};

// The collective `op` of `bytes` (all-reduce, all-gather, reduce-scatter), its whole tensor in
// the group's buffers or not: the collective to time.
std::function<ddp::comm::WorkPtr()> collective(ddp::comm::ProcessGroup& pg, const std::string& op,
                                               int64_t bytes, const at::TensorOptions& options,
                                               bool buffers, ddp::comm::ReduceOp reduce) {
  const int64_t count = bytes / 4;
  auto whole = buffers ? pg.allocate_buffer(count, options).fill_(1) : at::ones({count}, options);
  auto part = at::ones({count / pg.world_size()}, options);
  if (op == "all-gather") return [&pg, whole, part]() mutable { return pg.all_gather(whole, part); };
  if (op == "reduce-scatter") {
    return [&pg, whole, part, reduce]() mutable { return pg.reduce_scatter(part, whole, reduce); };
  }
  return [&pg, whole, reduce]() mutable { return pg.all_reduce(whole, reduce); };
}

double time_collective(ddp::comm::ProcessGroup& pg, const std::function<ddp::comm::WorkPtr()>& run,
                       const at::Device& device, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run()->wait();
  pg.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run()->wait();
  const double local =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  // The slowest rank's time is the collective's time.
  auto slowest = at::full({1}, local, at::kDouble).to(device);
  pg.all_reduce(slowest, ddp::comm::ReduceOp::kMax)->wait();
  return slowest.cpu().item<double>();
}

// One memcpy of `bytes` between two buffers of this process, warmed and averaged.
double time_memcpy(int64_t bytes, int iters) {
  std::vector<uint8_t> from(static_cast<size_t>(bytes), 1);
  std::vector<uint8_t> to(static_cast<size_t>(bytes), 0);
  std::memcpy(to.data(), from.data(), from.size());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(to.data(), from.data(), from.size());
    // Every copy's bytes count as read (as benchmark::DoNotOptimize does): none is left out.
    asm volatile("" : : "g"(to.data()) : "memory");
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// The same memcpy run by every rank at once (they share the memory bus): the slowest rank's time,
// the unit of an all-reduce's floor when every rank moves its bytes at the same moment.
double time_memcpy_on_every_rank(ddp::comm::ProcessGroup& pg, int64_t bytes, int iters,
                                 const at::Device& device) {
  pg.barrier()->wait();
  auto slowest = at::full({1}, time_memcpy(bytes, iters), at::kDouble).to(device);
  pg.all_reduce(slowest, ddp::comm::ReduceOp::kMax)->wait();
  return slowest.cpu().item<double>();
}

// One row: the collective of `bytes` (in a buffer the group allocated with `buffers`), and the
// memcpys beside it.
void measure(ddp::comm::ProcessGroup& pg, int64_t bytes, const at::Device& device, bool buffers,
             const cxxopts::ParseResult& args) {
  const int iters = args["iters"].as<int>();
  const int64_t count = bytes / 4;
  const std::string op = args["op"].as<std::string>();
  const auto reduce =
      args["average"].as<bool>() ? ddp::comm::ReduceOp::kAvg : ddp::comm::ReduceOp::kSum;
  const auto run =
      collective(pg, op, bytes, at::TensorOptions(at::kFloat).device(device), buffers, reduce);
  const double seconds = time_collective(pg, run, device, args["warmup"].as<int>(), iters);
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  const int n = pg.world_size();
  const double busbw = algbw * (op == "all-reduce" ? 2.0 : 1.0) * (n - 1) / n;
  const double together = time_memcpy_on_every_rank(pg, bytes, iters, device);
  if (pg.rank() == 0) {
    const double copy = time_memcpy(bytes, iters);
    std::cout << fmt::format("{:>12} {:>12} {:>12.1f} {:>10.3f} {:>10.3f} {:>12.1f} {:>12.1f}\n",
                             bytes, count, seconds * 1e6, algbw, busbw, copy * 1e6, together * 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("ddp_bench_allreduce", "All-reduce bandwidth of a ddp backend");
  options.add_options()("backend", "gloo, shm, mpi, nccl, local (default: the launch's default)",
                        cxxopts::value<std::string>()->default_value("auto"))(
      "min-bytes", "smallest message", cxxopts::value<int64_t>()->default_value("4096"))(
      "max-bytes", "largest message", cxxopts::value<int64_t>()->default_value("67108864"))(
      "factor", "size multiplier between rows", cxxopts::value<int64_t>()->default_value("4"))(
      "warmup", "untimed iterations per size", cxxopts::value<int>()->default_value("3"))(
      "iters", "timed iterations per size", cxxopts::value<int>()->default_value("20"))(
      "device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))(
      "threads", "intra-op threads", cxxopts::value<int>()->default_value("1"))(
      "buffers", "all-reduce buffers the group allocates (ProcessGroup::allocate_buffer), as DDP's "
      "buckets are")("op", "all-reduce, all-gather or reduce-scatter",
                     cxxopts::value<std::string>()->default_value("all-reduce"))(
      "average", "average (DDP's default hook's op) instead of summing")(
      "h,help", "print this help");
  try {
    auto args = options.parse(argc, argv);
    if (args.count("help") != 0U) {
      std::cout << options.help();
      return 0;
    }
    const std::string op = args["op"].as<std::string>();
    if (op != "all-reduce" && op != "all-gather" && op != "reduce-scatter") {
      throw ddp::InputError("--op " + op + ": expected all-reduce, all-gather or reduce-scatter");
    }
    at::set_num_threads(args["threads"].as<int>());
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    const bool cuda = args["device"].as<std::string>() == "cuda";
    std::string backend = args["backend"].as<std::string>();
    if (backend == "auto") backend = ddp::comm::default_backend(launch, cuda);
    std::shared_ptr<ddp::comm::ProcessGroup> pg =
        ddp::comm::create_process_group(backend, launch, {}, cuda);
    // TORCH_DISTRIBUTED_DEBUG=DETAIL as ddp::init_process_group() honours it: what it costs is
    // measured here (bench/compare_detail.py).
    const bool detail =
        ddp::comm::debug_level(ddp::comm::current_env()) == ddp::comm::DebugLevel::kDetail;
    if (detail) pg = ddp::comm::check_collectives(pg);
    const auto device =
        cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank))
             : at::Device(at::kCPU);
    const int n = pg->world_size();
    if (pg->rank() == 0) {
      std::cout << fmt::format(
          "# ddp_bench_allreduce: {}, backend {}, {} ranks, float32 {}, {} iterations{}{}\n",
          args["op"].as<std::string>(), pg->backend_name(), n,
          args["average"].as<bool>() ? "average" : "sum", args["iters"].as<int>(),
          detail ? ", DETAIL" : "",
          args["buffers"].as<bool>() ? ", the group's buffers" : "");
      std::cout << fmt::format("{:>12} {:>12} {:>12} {:>10} {:>10} {:>12} {:>12}\n", "bytes",
                               "elements", "time(us)", "algbw", "busbw", "memcpy(us)", "memcpy-all");
    }
    for (int64_t bytes = args["min-bytes"].as<int64_t>(); bytes <= args["max-bytes"].as<int64_t>();
         bytes *= args["factor"].as<int64_t>()) {
      measure(*pg, bytes, device, args["buffers"].as<bool>(), args);
    }
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "ddp_bench_allreduce: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "ddp_bench_allreduce: " << e.what() << "\n";
    return 2;
  }
}
