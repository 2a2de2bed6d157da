// An epoch resharded over a new world size (Note [An epoch is a sequence the ranks take in
// strides]): on the same world it goes on as if nothing happened; across any chain of world
// sizes every sample is trained exactly once, apart from the padding each reshard adds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/data/distributed_sampler.h"

namespace {

using ddp::data::rank_share;
using ddp::data::reshard;
using ddp::data::trained_prefix;

std::vector<int64_t> ids_of(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// The ids every rank has trained once each trained its first `per_rank` (as the ranks do).
std::multiset<int64_t> trained_by_ranks(const torch::Tensor& sequence, int64_t world,
                                        int64_t per_rank) {
  std::multiset<int64_t> out;
  for (int64_t r = 0; r < world; ++r) {
    const auto share = ids_of(rank_share(sequence, world, r));
    const auto n = std::min<size_t>(share.size(), static_cast<size_t>(per_rank));
    out.insert(share.begin(), share.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

TEST(Reshard, WhatTheRanksTrainedIsAPrefixOfTheSequence) {
  for (int64_t size : {1, 7, 100, 1001}) {
    for (int64_t world = 1; world <= 5; ++world) {
      ddp::data::DistributedSampler sampler(size, world, 0, true, 42);
      sampler.set_epoch(3);
      for (bool uneven : {false, true}) {
        const auto sequence = sampler.sequence(uneven);
        for (int64_t per_rank : {0, 1, 2, 9, 400}) {
          const int64_t n = trained_prefix(sequence.size(0), world, per_rank);
          const auto prefix = ids_of(sequence.narrow(0, 0, n));
          EXPECT_EQ(trained_by_ranks(sequence, world, per_rank),
                    std::multiset<int64_t>(prefix.begin(), prefix.end()))
              << "size " << size << " world " << world << " per rank " << per_rank;
        }
      }
    }
  }
}

TEST(Reshard, OnTheSameWorldEveryRankGoesOnWithItsOwnShare) {
  for (int64_t size : {7, 100, 1001}) {
    for (int64_t world = 1; world <= 5; ++world) {
      for (int64_t per_rank : {0, 1, 3, 17}) {
        ddp::data::DistributedSampler sampler(size, world, 0, true, 7);
        sampler.set_epoch(1);
        const auto sequence = sampler.sequence();
        const int64_t n = trained_prefix(sequence.size(0), world, per_rank);
        const auto rest = reshard(sequence.narrow(0, n, sequence.size(0) - n), world);
        for (int64_t r = 0; r < world; ++r) {
          ddp::data::DistributedSampler own(size, world, r, true, 7);
          own.set_epoch(1);
          const auto whole = own.indices();
          const int64_t done = std::min<int64_t>(per_rank, whole.size(0));
          EXPECT_EQ(ids_of(rank_share(rest, world, r)),
                    ids_of(whole.narrow(0, done, whole.size(0) - done)))
              << "size " << size << " world " << world << " rank " << r;
        }
      }
    }
  }
}

// Random chains of world sizes, each change after a random number of samples per rank: every id
// of the dataset is trained once, plus the ids each reshard repeated as padding (fewer than the
// new world size each time).
TEST(Reshard, AcrossAnyChainOfWorldSizesEverySampleIsTrainedOnce) {
  std::mt19937 random(2026);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t size = 1 + static_cast<int64_t>(random() % 300);
    const bool pad = trial % 4 != 0;  // a quarter uneven (--uneven: no padding)
    int64_t world = 1 + static_cast<int64_t>(random() % 6);
    ddp::data::DistributedSampler sampler(size, world, 0, true, static_cast<uint64_t>(trial));
    torch::Tensor sequence = sampler.sequence(!pad);
    std::multiset<int64_t> trained, padding;
    for (int change = 0; change < 1 + trial % 4; ++change) {
      const int64_t per_rank = static_cast<int64_t>(random() % 40);
      const auto done = trained_by_ranks(sequence, world, per_rank);
      trained.insert(done.begin(), done.end());
      const int64_t n = trained_prefix(sequence.size(0), world, per_rank);
      const auto rest = sequence.narrow(0, n, sequence.size(0) - n);
      world = 1 + static_cast<int64_t>(random() % 6);
      sequence = reshard(rest, world, pad);
      const auto added = ids_of(sequence.narrow(0, rest.size(0), sequence.size(0) - rest.size(0)));
      ASSERT_LT(static_cast<int64_t>(added.size()), pad ? world : 1) << "trial " << trial;
      padding.insert(added.begin(), added.end());
    }
    const auto last = trained_by_ranks(sequence, world, sequence.size(0));  // the epoch's end
    trained.insert(last.begin(), last.end());
    // Every id once, with the sampler's own padding at the epoch's start.
    const auto first = ids_of(sampler.sequence(!pad));
    std::map<int64_t, int64_t> count;
    for (int64_t id : trained) ++count[id];
    for (int64_t id : padding) --count[id];
    for (int64_t id : first) --count[id];
    for (const auto& [id, c] : count) {
      ASSERT_EQ(c, 0) << "trial " << trial << ": sample " << id << " trained " << c
                      << " time(s) more (or fewer, when negative) than once";
    }
  }
}

TEST(Reshard, AWorldOfNoRanksIsAnInputError) {
  const auto ids = torch::arange(5, torch::kInt64);
  EXPECT_THROW(reshard(ids, 0), ddp::InputError);
  EXPECT_THROW(rank_share(ids, 2, 2), ddp::InputError);
  EXPECT_EQ(ids_of(reshard(ids, 3)), (std::vector<int64_t>{0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(ids_of(reshard(ids, 3, /*pad=*/false)), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

}  // namespace
