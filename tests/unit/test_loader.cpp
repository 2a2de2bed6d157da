// The batch loader: the same batches as gathering directly, whatever the number of workers;
// augmentation that is a crop of the zero-padded image, maybe mirrored, seeded per rank and epoch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/data/loader.h"

namespace {

using ddp::data::Batch;
using ddp::data::BatchLoader;
using ddp::data::LoaderOptions;
using ddp::data::TensorDataset;

TensorDataset images(int64_t n) {
  torch::manual_seed(0);
  TensorDataset d;
  d.inputs = torch::randn({n, 1, 12, 10});
  d.targets = torch::arange(n);
  d.num_classes = n;
  return d;
}

std::vector<Batch> all_batches(const TensorDataset& d, const torch::Tensor& order,
                               LoaderOptions o) {
  BatchLoader loader(d, order, o);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(*b);
  EXPECT_EQ(static_cast<int64_t>(out.size()), loader.num_batches());
  return out;
}

TEST(BatchLoader, GivesTheGatheredBatchesInOrderWithAnyNumberOfWorkers) {
  const auto d = images(23);
  const auto order = torch::randperm(23, torch::kLong);
  for (int workers : {0, 1, 3}) {
    LoaderOptions o;
    o.batch_size = 5;
    o.workers = workers;
    const auto batches = all_batches(d, order, o);
    ASSERT_EQ(batches.size(), 5u) << workers;
    EXPECT_EQ(batches.back().size(), 3);  // the last is smaller
    for (size_t i = 0; i < batches.size(); ++i) {
      const auto expected =
          d.gather(order.narrow(0, static_cast<int64_t>(i) * 5, batches[i].size()));
      EXPECT_TRUE(torch::equal(batches[i].input, expected.input)) << workers << " " << i;
      EXPECT_TRUE(torch::equal(batches[i].target, expected.target)) << workers << " " << i;
    }
  }
}

TEST(BatchLoader, AugmentationDependsOnSeedRankAndEpochButNotOnTheWorkers) {
  const auto d = images(40);
  const auto order = torch::arange(40);
  LoaderOptions o;
  o.batch_size = 8;
  o.augment = ddp::data::Augment{};
  o.seed = 7;
  const auto serial = all_batches(d, order, o);
  o.workers = 3;
  const auto parallel = all_batches(d, order, o);
  ASSERT_EQ(serial.size(), parallel.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_TRUE(torch::equal(serial[i].input, parallel[i].input)) << i;
  }
  o.epoch = 1;
  EXPECT_FALSE(torch::equal(all_batches(d, order, o)[0].input, serial[0].input));
  o.epoch = 0;
  o.rank = 1;
  EXPECT_FALSE(torch::equal(all_batches(d, order, o)[0].input, serial[0].input));
}

TEST(BatchLoader, AnAugmentedImageIsAShiftedCropOfThePaddedOneMaybeMirrored) {
  const auto d = images(64);
  ddp::data::Augment a;
  a.pad_value = -0.5;
  const Batch in = d.gather(torch::arange(64));
  const Batch out = ddp::data::augment(in, a, 123);
  const auto padded = torch::constant_pad_nd(in.input, {4, 4, 4, 4}, -0.5);
  int shifted = 0, mirrored = 0;
  for (int64_t i = 0; i < 64; ++i) {
    bool found = false;
    for (int64_t dy = 0; dy <= 8 && !found; ++dy) {
      for (int64_t dx = 0; dx <= 8 && !found; ++dx) {
        const auto crop = padded[i].narrow(1, dy, 12).narrow(2, dx, 10);
        for (bool flip : {false, true}) {
          if (torch::equal(out.input[i], flip ? crop.flip({2}) : crop)) {
            found = true;
            shifted += (dy != 4 || dx != 4);
            mirrored += flip;
            break;
          }
        }
      }
    }
    EXPECT_TRUE(found) << "sample " << i;
  }
  EXPECT_GT(shifted, 40);
  EXPECT_GT(mirrored, 16);
  EXPECT_LT(mirrored, 48);
  EXPECT_TRUE(torch::equal(out.target, in.target));
}

TEST(BatchLoader, AWorkersErrorReachesTheCaller) {
  const auto d = images(10);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  BatchLoader loader(d, torch::tensor({0, 1, 2, 3, 4, 5, 99}, torch::kLong), o);
  EXPECT_TRUE(loader.next().has_value());
  EXPECT_THROW(loader.next(), c10::Error);  // index 99 of 10 samples
}

}  // namespace
