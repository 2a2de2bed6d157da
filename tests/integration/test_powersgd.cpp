// PowerSGD against PyTorch's own powerSGD_hook (Debian's python3-torch): the same gradients on 3
// real ranks, PyTorch's results from tests/python/powersgd_reference.py, ours from
// powersgd_worker.cpp on gloo and on mpi.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ranks.h"
#include "subprocess.h"

namespace {

constexpr int kWorld = 3;

// PyTorch's results, made once for the tests of this program (in a test body, so that a failure
// fails the test rather than skipping it). Empty when the reference failed.
const std::string& reference_dir() {
  static ddp::testing::TempDir dir;
  static const std::string result = [] {
    const auto results = ddp::testing::run_env_ranks(
        kWorld,
        {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/powersgd_reference.py",
         dir.path()},
        std::chrono::seconds(240));
    bool ok = true;
    for (const auto& r : results) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      ok = ok && r.exit_code == 0;
    }
    return ok ? dir.path() : std::string();
  }();
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
  std::string all;
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    all += r.output;
  }
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
