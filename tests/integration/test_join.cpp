// Join (uneven inputs) against PyTorch's own DDP with torch.distributed.algorithms.Join (Debian's
// python3-torch): 3 ranks with 3, 5 and 7 batches, PyTorch's run in
// tests/python/join_reference.py, ours in join_worker.cpp on gloo and on mpi, the same data.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "built_paths.h"
#include "ranks.h"
#include "subprocess.h"

namespace {

constexpr int kWorld = 3;

// PyTorch's run, made once for the tests of this program. Empty when it failed.
const std::string& reference_dir() {
  static ddp::testing::TempDir dir;
  static const std::string result =
      ddp::testing::run_python_reference("join_reference.py", kWorld, dir.path()) ? dir.path() : "";
  return result;
}

void expect_every_rank_equal(const std::string& output) {
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(output.find(
                  fmt::format("rank {}/{}: {} batches, max relative error", r, kWorld, 3 + 2 * r)),
              std::string::npos)
        << output;
  }
}

TEST(Join, UnevenInputsEqualPyTorchsJoinOnGloo) {
  const auto dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "PyTorch's reference failed";
  const auto results = ddp::testing::run_env_ranks(kWorld, {DDP_JOIN_WORKER_BIN, "gloo", dir},
                                                   std::chrono::seconds(120));
  const std::string all = ddp::testing::expect_all_exit_zero(results);
  expect_every_rank_equal(all);
}

TEST(Join, UnevenInputsEqualPyTorchsJoinUnderMpirun) {
  const auto dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "PyTorch's reference failed";
  const auto r = ddp::testing::run_mpirun(kWorld, {DDP_JOIN_WORKER_BIN, "mpi", dir},
                                          std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_every_rank_equal(r.output);
}

}  // namespace
