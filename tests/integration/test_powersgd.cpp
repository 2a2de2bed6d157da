// PowerSGD against PyTorch's own powerSGD_hook (Debian's python3-torch): the same gradients on 3
// real ranks, PyTorch's results from tests/python/powersgd_reference.py, ours from
// powersgd_worker.cpp on gloo and on mpi.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "built_paths.h"
#include "ranks.h"
#include "subprocess.h"

namespace {

constexpr int kWorld = 3;

// PyTorch's results, made once for the tests of this program (in a test body, so that a failure
// fails the test rather than skipping it). Empty when the reference failed.
const std::string& reference_dir() {
  static ddp::testing::TempDir dir;
  static const std::string result =
      ddp::testing::run_python_reference("powersgd_reference.py", kWorld, dir.path()) ? dir.path()
                                                                                      : "";
  return result;
}

void expect_every_rank_agrees(const std::string& output) {
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_NE(output.find(fmt::format("rank {}/{}: 0 failures", r, kWorld)), std::string::npos)
        << output;
  }
}

TEST(PowerSgd, EqualsPyTorchsHookOnGloo) {
  const auto dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "PyTorch's reference failed";
  const auto results = ddp::testing::run_env_ranks(kWorld, {DDP_POWERSGD_WORKER_BIN, "gloo", dir},
                                                   std::chrono::seconds(120));
  const std::string all = ddp::testing::expect_all_exit_zero(results);
  expect_every_rank_agrees(all);
}

TEST(PowerSgd, EqualsPyTorchsHookUnderMpirun) {
  const auto dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "PyTorch's reference failed";
  const auto r = ddp::testing::run_mpirun(kWorld, {DDP_POWERSGD_WORKER_BIN, "mpi", dir},
                                          std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_every_rank_agrees(r.output);
}

}  // namespace
