// Batch gathering, the random dataset, and the sampler's basic contract.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/data/dataset.h"
#include "ddp/data/distributed_sampler.h"

namespace {

TEST(Gather, ReturnsTheNamedRowsInOrder) {
  ddp::data::TensorDataset set;
  set.inputs = torch::arange(20, torch::kFloat32).reshape({10, 2});
  set.targets = torch::arange(10, torch::kInt64);
  auto batch = set.gather(torch::tensor({7, 2, 2, 9}, torch::kInt64));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({7, 2, 2, 9}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(batch.input,
                           torch::tensor({{14.f, 15.f}, {4.f, 5.f}, {4.f, 5.f}, {18.f, 19.f}})));
  EXPECT_EQ(batch.size(), 4);
}

TEST(RandomDataset, IsSeededAndLearnable) {
  auto a = ddp::data::make_random_dataset(100, 5, 2, 7);
  auto b = ddp::data::make_random_dataset(100, 5, 2, 7);
  auto c = ddp::data::make_random_dataset(100, 5, 2, 8);
  EXPECT_EQ(a.inputs.sizes(), (std::vector<int64_t>{100, 5}));
  EXPECT_EQ(a.targets.sizes(), (std::vector<int64_t>{100, 2}));
  EXPECT_TRUE(torch::equal(a.inputs, b.inputs));
  EXPECT_FALSE(torch::equal(a.inputs, c.inputs));
  // Targets are a linear map plus noise of std 0.1: least squares leaves a residual near 0.01.
  auto solution = std::get<0>(torch::linalg_lstsq(a.inputs, a.targets));
  auto residual = (a.inputs.matmul(solution) - a.targets).pow(2).mean().item<double>();
  EXPECT_LT(residual, 0.02);
  EXPECT_GT(residual, 0.005);
}

TEST(DistributedSampler, OneRankIsAPermutationSeededByEpoch) {
  ddp::data::DistributedSampler s(10, 1, 0, true, 42);
  auto e0 = s.indices();
  EXPECT_TRUE(torch::equal(std::get<0>(e0.sort()), torch::arange(10, torch::kInt64)));
  s.set_epoch(1);
  EXPECT_FALSE(torch::equal(s.indices(), e0));
  s.set_epoch(0);
  EXPECT_TRUE(torch::equal(s.indices(), e0));
}

TEST(DistributedSampler, PadsAndSplitsLikePyTorch) {
  // No shuffle, 7 samples, 3 ranks: padded to 9 with the head (0, 1), strided.
  std::vector<std::vector<int64_t>> expected = {{0, 3, 6}, {1, 4, 0}, {2, 5, 1}};
  for (int64_t r = 0; r < 3; ++r) {
    ddp::data::DistributedSampler s(7, 3, r, false);
    EXPECT_TRUE(torch::equal(s.indices(), torch::tensor(expected[r], torch::kInt64))) << r;
  }
  ddp::data::DistributedSampler dropping(7, 3, 2, false, 0, true);
  EXPECT_TRUE(torch::equal(dropping.indices(), torch::tensor({2, 5}, torch::kInt64)));
}

TEST(EvaluationIndices, CoverEverySampleOnce) {
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < 3; ++r) {
    auto idx = ddp::data::evaluation_indices(7, 3, r);
    seen.insert(seen.end(), idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

}  // namespace
