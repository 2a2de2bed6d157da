// The straggler attribution's judgement (train/straggler.h): window sums in, a rank and a cause
// out, against the other ranks' median.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ddp/train/straggler.h"

namespace {

using ddp::train::find_straggler;
using ddp::train::StepTimes;
using ddp::train::StragglerCause;

// A rank's sums over `steps` steps from its milliseconds a step.
StepTimes per_step(double data_ms, double compute_ms, double comm_ms, double optimizer_ms,
                   int steps = 50) {
  const double s = steps / 1000.0;
  return StepTimes{data_ms * s, compute_ms * s, comm_ms * s, optimizer_ms * s};
}

TEST(Straggler, ASlowComputingRankIsNamedWithItsRatioOverTheOthersMedian) {
  // Rank 1 computes 41 ms a step where the others take 14 (and 13, 15): the others wait for it.
  const std::vector<StepTimes> ranks = {per_step(1, 13, 28, 1), per_step(1, 40, 1, 1),
                                        per_step(1, 14, 27, 1), per_step(1, 15, 26, 1)};
  const auto v = find_straggler(ranks, 50, 2.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->cause, StragglerCause::kComputation);
  EXPECT_NEAR(v->rank_ms, 41.0, 1e-9);    // compute and optimizer
  EXPECT_NEAR(v->median_ms, 15.0, 1e-9);  // the median of 14, 15, 16
  EXPECT_NEAR(v->ratio, 41.0 / 15.0, 1e-9);
  EXPECT_EQ(ddp::train::straggler_message(*v, 101, 150),
            "straggler: rank 1 computes 2.7x slower than the median of the other ranks over "
            "steps 101-150 (forward+backward+optimizer 41.0 ms vs 15.0 ms a step); data and "
            "network normal");
}

TEST(Straggler, ASlowLoaderIsToldApartFromSlowComputation) {
  const std::vector<StepTimes> ranks = {per_step(0.2, 10, 30, 1), per_step(30, 10, 0.5, 1)};
  const auto v = find_straggler(ranks, 50, 2.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->cause, StragglerCause::kDataLoading);
  EXPECT_EQ(std::string(ddp::train::cause_name(v->cause)), "data loading");
  EXPECT_NE(ddp::train::straggler_message(*v, 1, 50)
                .find("waits 150.0x longer for data than the median of the other ranks over "
                      "steps 1-50 (data 30.0 ms vs 0.2 ms a step); computation and network normal"),
            std::string::npos);
}

TEST(Straggler, BalancedRanksAndTinyDifferencesNameNone) {
  // 10 % apart: no ratio reaches 2.
  EXPECT_FALSE(find_straggler({per_step(1, 20, 3, 1), per_step(1, 22, 1, 1), per_step(1, 21, 2, 1)},
                              50, 2.0));
  // Three times the others' compute, but 0.6 ms a step more: below the floor, noise on such steps.
  EXPECT_FALSE(find_straggler({per_step(0, 0.3, 0.6, 0), per_step(0, 0.9, 0, 0)}, 50, 2.0));
  // Off, one rank, no steps.
  EXPECT_FALSE(find_straggler({per_step(1, 10, 30, 1), per_step(1, 40, 1, 1)}, 50, 0.0));
  EXPECT_FALSE(find_straggler({per_step(1, 10, 30, 1)}, 50, 2.0));
  EXPECT_FALSE(find_straggler({per_step(1, 10, 30, 1), per_step(1, 40, 1, 1)}, 0, 2.0));
}

TEST(Straggler, CommunicationIsNamedOnlyWhereNoRankComputesOrLoadsSlowly) {
  // Equal work, one rank blocked in collectives 4x the others' (its link): communication.
  const std::vector<StepTimes> link = {per_step(1, 10, 2, 1), per_step(1, 10, 8, 1),
                                       per_step(1, 10, 2, 1)};
  const auto v = find_straggler(link, 50, 2.0);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->cause, StragglerCause::kCommunication);
  // A slow computer makes the others wait: they are not named for it.
  const auto slow = find_straggler(
      {per_step(1, 10, 30, 1), per_step(1, 40, 1, 1), per_step(1, 10, 30, 1)}, 50, 2.0);
  ASSERT_TRUE(slow.has_value());
  EXPECT_EQ(slow->rank, 1);
  EXPECT_EQ(slow->cause, StragglerCause::kComputation);
}

TEST(StragglerRecord, NamesOnceTellsTheRecoveryAndKeepsTheEpochsSums) {
  ddp::train::StragglerRecord record(2.0);
  const std::vector<StepTimes> slow = {per_step(1, 10, 30, 1), per_step(1, 40, 1, 1)};
  const std::vector<StepTimes> even = {per_step(1, 10, 2, 1), per_step(1, 10, 2, 1)};
  auto lines = record.add_window(slow, 50, 50);
  EXPECT_NE(lines.warning.find("straggler: rank 1 computes"), std::string::npos);
  EXPECT_NE(lines.warning.find("steps 1-50"), std::string::npos);
  EXPECT_EQ(lines.info, "");
  lines = record.add_window(slow, 50, 100);  // still the same: not named again
  EXPECT_EQ(lines.warning, "");
  EXPECT_EQ(lines.info, "");
  lines = record.add_window(even, 50, 150);
  EXPECT_EQ(lines.warning, "");
  EXPECT_EQ(lines.info,
            "straggler: rank 1 recovered over steps 101-150 (busy 12.0 ms a step, the others' "
            "median 12.0 ms)");
  EXPECT_EQ(record.run_steps(), 150);
  EXPECT_NEAR(record.run()[1].compute_s, 0.04 * 100 + 0.01 * 50, 1e-12);
  ASSERT_TRUE(record.epoch_straggler().has_value());
  EXPECT_EQ(record.epoch_straggler()->rank, 1);
  record.begin_epoch();
  EXPECT_EQ(record.epoch_steps(), 0);
  EXPECT_FALSE(record.epoch_straggler().has_value());
  // A world of another size starts the sums afresh.
  record.add_window({per_step(1, 10, 2, 1), per_step(1, 10, 2, 1), per_step(1, 10, 2, 1)}, 50, 200);
  EXPECT_EQ(record.run().size(), 3u);
  EXPECT_EQ(record.run_steps(), 50);
}

TEST(StragglerRecord, TheTableHasARowPerRankInMillisecondsAStep) {
  const auto lines = ddp::train::straggler_table({per_step(1, 10, 30, 1), per_step(2, 40, 1, 1)}, 50);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[1].find("   0      1.00       10.00     30.00          1.00"), std::string::npos)
      << lines[1];
  EXPECT_NE(lines[2].find("   1      2.00       40.00      1.00          1.00"), std::string::npos)
      << lines[2];
  EXPECT_NE(lines[2].find("3.58"), std::string::npos) << lines[2];  // 43 / 12
}

}  // namespace
