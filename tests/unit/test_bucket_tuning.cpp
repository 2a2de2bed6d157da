// bucket_cap_mb "auto" (core/bucket_tuning.h): which sizes are tried, the schedule of trials, the
// size kept. Through the trainer on real ranks: BucketTuning.* in
// tests/integration/test_ddp_train.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/bucket_tuning.h"

namespace {

using ddp::core::BucketCapTuner;
using ddp::core::TensorSlot;

constexpr size_t kMiB = size_t{1} << 20;

// Six gradients of 1 MiB, arriving last to first, with the first bucket 1 MiB: 0.5 and 1 MiB put
// each in a bucket of its own, 2 MiB pairs them, 5 and more put the five after the first in one
// bucket: 25 speaks for those.
TEST(BucketTuning, OneCandidatePerLayoutTheDefaultForItsOwn) {
  const std::vector<TensorSlot> six(6, TensorSlot{kMiB});
  const std::vector<int64_t> last_first = {5, 4, 3, 2, 1, 0};
  EXPECT_EQ(ddp::core::bucket_cap_candidates(six, kMiB, last_first),
            (std::vector<double>{0.5, 2, 25}));
  // A model smaller than the first bucket has one layout whatever the size.
  const std::vector<TensorSlot> small(3, TensorSlot{1000});
  EXPECT_EQ(ddp::core::bucket_cap_candidates(small, kMiB, {2, 1, 0}), (std::vector<double>{25}));
  // Forty gradients of 1 MiB: every size of the ladder up to 50 cuts them differently.
  const std::vector<TensorSlot> forty(40, TensorSlot{kMiB});
  EXPECT_EQ(ddp::core::bucket_cap_candidates(forty, kMiB, {}),
            (std::vector<double>{0.5, 2, 5, 10, 25, 50}));
}

TEST(BucketTuning, KeepsTheFastestWhenItBeatsTheDefaultBeyondTheMargin) {
  const std::vector<double> caps = {0.5, 2, 25};
  EXPECT_EQ(ddp::core::fastest_bucket_cap(caps, {1.0, 0.9, 1.0}), 2);
  EXPECT_EQ(ddp::core::fastest_bucket_cap(caps, {1.0, 0.99, 1.0}), 25);  // within 2%: noise
  EXPECT_EQ(ddp::core::fastest_bucket_cap(caps, {0.97, 0.99, 1.0}), 0.5);
  EXPECT_EQ(ddp::core::fastest_bucket_cap(caps, {1.2, 1.1, 1.0}), 25);
  EXPECT_EQ(ddp::core::fastest_bucket_cap({0.5, 2}, {1.0, 0.995}), 2);  // no default to keep
}

// Two rounds, the second in reverse: a a a b b b c c c | c c c b b b a a a (one step of warm-up,
// two timed), the size changing only between different candidates; the medians of the timed
// steps decide.
TEST(BucketTuning, TriesEachSizeInTwoRoundsAndKeepsTheFastestMedian) {
  BucketCapTuner tuner({0.5, 2, 25}, /*rounds=*/2, /*warmup=*/1, /*timed=*/2);
  EXPECT_EQ(tuner.steps(), 18);
  const std::vector<double> expected = {0.5, 0.5, 0.5, 2, 2, 2, 25,  25,  25,
                                        25,  25,  25,  2, 2, 2, 0.5, 0.5, 0.5};
  std::vector<double> caps;
  std::vector<bool> changes;
  // The warm-up steps are slow (never counted); 2 MiB's timed steps are the fastest.
  auto seconds_of = [](double cap, int position) {
    if (position == 0) return 9.0;
    return cap == 2 ? 0.5 : 1.0 + 0.01 * position;
  };
  for (int step = 0; !tuner.done(); ++step) {
    caps.push_back(tuner.cap_mb());
    changes.push_back(tuner.record(seconds_of(tuner.cap_mb(), step % 3)));
  }
  EXPECT_EQ(caps, expected);
  const std::vector<bool> expected_changes = {false, false, true,  false, false, true,
                                              false, false, false, false, false, true,
                                              false, false, true,  false, false, true};
  EXPECT_EQ(changes, expected_changes);
  auto group = ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
  EXPECT_EQ(tuner.agree(*group, c10::Device(c10::kCPU)), 2);
  EXPECT_EQ(tuner.agreed_seconds(), (std::vector<double>{1.02, 0.5, 1.02}));
}

}  // namespace
