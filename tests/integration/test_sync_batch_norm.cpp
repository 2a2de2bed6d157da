// SyncBatchNorm on 2 and 3 real ranks equals BatchNorm on the concatenated batch: forward output,
// input gradient, weight and bias gradients, running statistics (sync_bn_worker.cpp).
#include <gtest/gtest.h>

#include "built_paths.h"
#include "ranks.h"

namespace {

class SyncBatchNormRanks : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormRanks, EqualBatchNormOnTheWholeBatch) {
  const auto ranks =
      ddp::testing::run_env_ranks(GetParam(), {DDP_SYNC_BN_WORKER_BIN}, std::chrono::seconds(120));
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ": " << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("rank " + std::to_string(r) + ": output"), std::string::npos)
        << ranks[r].output;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, SyncBatchNormRanks, ::testing::Values(2, 3));

}  // namespace
