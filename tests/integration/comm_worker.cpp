// One rank of the multi-process comm tests, started by test_comm.cpp with the env contract or by
// mpirun. Checks every collective against closed-form results and exits 0 only if all hold.
//   comm_worker BACKEND collectives
//   comm_worker BACKEND skip TIMEOUT_MS   the last rank never joins all_reduce #2
//   comm_worker BACKEND setup             only creates the group (bad env, bad backend)
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "ddp/comm/rendezvous.h"

namespace {

using ddp::comm::ReduceOp;

int g_failures = 0;
int g_checks = 0;

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ++g_checks;
  if (!at::equal(got, want)) {
    ++g_failures;
    std::cout << "MISMATCH " << what << ": max abs diff "
              << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>()
              << std::endl;
  }
}

// Element i of rank r holds (r + 1) * (i % 97): sums, min and max have closed forms.
at::Tensor pattern(int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kLong).remainder(97).to(dtype);
}

void check_collectives(ddp::comm::ProcessGroup& pg) {
  const int w = pg.world_size();
  const int r = pg.rank();
  const int64_t sum_of_ranks = static_cast<int64_t>(w) * (w + 1) / 2;  // of (r + 1)
  for (auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
    // Up to 3,000,000 elements (24 MB of double): several of gloo's and MPI's chunks, and not a
    // power of two; the 10,000,000 of earlier runs cost CI minutes and found nothing more.
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 20, int64_t{3000000}}) {
      const std::string tag = fmt::format("{} n={}", c10::toString(dtype), n);
      const auto base = pattern(n, dtype);

      auto t = base * (r + 1);
      pg.all_reduce(t, ReduceOp::kSum)->wait();
      expect_equal(t, base * sum_of_ranks, "all_reduce(sum) " + tag);

      t = base * (r + 1);
      pg.all_reduce(t, ReduceOp::kAvg)->wait();
      const auto avg = at::isIntegralType(dtype, false) ? (base * sum_of_ranks).div(w, "trunc")
                                                        : (base * sum_of_ranks).div(w);
      expect_equal(t, avg, "all_reduce(avg) " + tag);

      t = base + r;
      pg.all_reduce(t, ReduceOp::kMin)->wait();
      expect_equal(t, base, "all_reduce(min) " + tag);
      t = base + r;
      pg.all_reduce(t, ReduceOp::kMax)->wait();
      expect_equal(t, base + (w - 1), "all_reduce(max) " + tag);

      // Broadcast from the last rank of a seeded random tensor; the others start from zeros.
      auto gen = at::detail::createCPUGenerator(1234 + static_cast<uint64_t>(n));
      const auto seeded =
          at::randint(-1000000, 1000000, {n}, gen, at::TensorOptions(at::kLong)).to(dtype);
      t = r == w - 1 ? seeded.clone() : at::zeros({n}, dtype);
      pg.broadcast(t, w - 1)->wait();
      expect_equal(t, seeded, "broadcast " + tag);

      // All-gather: rank q's block is base + q, in rank order.
      if (n <= (int64_t{1} << 20)) {
        auto out = at::empty({n * w}, dtype);
        pg.all_gather(out, base + r)->wait();
        std::vector<at::Tensor> blocks;
        for (int q = 0; q < w; ++q) blocks.push_back(base + q);
        expect_equal(out, at::cat(blocks), "all_gather " + tag);
      }
    }
  }
  // Several collectives in flight at once complete in order.
  std::vector<at::Tensor> ts;
  std::vector<ddp::comm::WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(at::full({1000}, static_cast<double>(i + r), at::kDouble));
    works.push_back(pg.all_reduce(ts.back()));
  }
  for (auto& work : works) work->wait();
  for (int i = 0; i < 4; ++i) {
    expect_equal(ts[i], at::full({1000}, static_cast<double>(i * w + (w - 1) * w / 2), at::kDouble),
                 fmt::format("overlapped all_reduce {}", i));
  }
  pg.barrier()->wait();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: comm_worker BACKEND collectives|skip|setup [TIMEOUT_MS]\n";
    return 64;
  }
  const std::string backend = argv[1];
  const std::string scenario = argv[2];
  try {
    const auto launch = ddp::comm::detect_launch(ddp::comm::current_env());
    ddp::comm::ProcessGroupOptions options;
    if (argc > 3) options.timeout = std::chrono::milliseconds(std::stoll(argv[3]));
    options.rendezvous_timeout = std::chrono::seconds(30);
    auto pg = ddp::comm::create_process_group(backend, launch, options, /*cuda_device=*/false);
    if (scenario == "collectives") {
      check_collectives(*pg);
      std::cout << fmt::format("rank {}/{}: {} checks, {} failures", pg->rank(), pg->world_size(),
                               g_checks, g_failures)
                << std::endl;
      return g_failures == 0 ? 0 : 3;
    }
    if (scenario == "skip") {
      auto t = at::ones({1000}, at::kFloat);
      pg->all_reduce(t)->wait();  // #1: everyone
      if (pg->rank() == pg->world_size() - 1) {
        std::cout << "rank " << pg->rank() << ": not joining all_reduce #2" << std::endl;
        // Long enough for the others to time out, short enough not to slow the test.
        std::this_thread::sleep_for(3 * options.timeout);
        return 0;
      }
      pg->all_reduce(t)->wait();  // #2: the last rank never comes
      std::cout << "rank " << pg->rank() << ": all_reduce #2 returned" << std::endl;
      return 0;
    }
    std::cout << "rank " << pg->rank() << ": group created, backend " << pg->backend_name()
              << std::endl;
    return 0;
  } catch (const ddp::Error& e) {
    std::cout << "error: " << e.what() << std::endl;
    return e.exit_code();
  }
}
