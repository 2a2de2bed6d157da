// Batch gathering, the random dataset, and the sampler's basic contract, in torch::data's loader
// too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/data/dataset.h"
#include "ddp/data/distributed_sampler.h"
#include "errors.h"

namespace {

// A torch::data dataset whose example i is the number i: a loader's batches are the indices its
// sampler gave it.
struct Numbers : torch::data::datasets::Dataset<Numbers, int64_t> {
  int64_t n;
  explicit Numbers(int64_t n) : n(n) {}
  int64_t get(size_t index) override { return static_cast<int64_t>(index); }
  c10::optional<size_t> size() const override { return static_cast<size_t>(n); }
};

// Every index a pass over `loader` yields, in order.
template <class Loader>
std::vector<int64_t> pass(Loader& loader, int64_t max_batches = -1) {
  std::vector<int64_t> seen;
  int64_t batches = 0;
  for (auto& batch : loader) {
    seen.insert(seen.end(), batch.begin(), batch.end());
    if (++batches == max_batches) break;
  }
  return seen;
}

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

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

TEST(DistributedSamplerInALoader, WorkersYieldTheIndicesOfEachEpochAndSetEpochReachesTheLoader) {
  // 103 samples on 4 ranks: padded to 104; batches of 5 leave a short last one.
  for (int64_t rank = 0; rank < 4; ++rank) {
    ddp::data::DistributedSampler sampler(103, 4, rank, /*shuffle=*/true, /*seed=*/9);
    auto loader = torch::data::make_data_loader(Numbers(103), sampler,
                                                torch::data::DataLoaderOptions(5).workers(2));
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);  // the copy the loader holds follows
      EXPECT_EQ(pass(*loader), as_vector(sampler.indices()))
          << "rank " << rank << " epoch " << epoch;
    }
    EXPECT_EQ(sampler.position(), sampler.num_samples());  // the loader's next() counted here
  }
}

TEST(DistributedSamplerInALoader, ASecondPassOverTheSameEpochStartsAgain) {
  ddp::data::DistributedSampler sampler(20, 2, 1);
  auto loader = torch::data::make_data_loader(Numbers(20), sampler, 3);
  const auto first = pass(*loader, 2);
  EXPECT_EQ(first.size(), 6u);
  EXPECT_EQ(pass(*loader), as_vector(sampler.indices()));
}

TEST(DistributedSamplerInALoader, SavedMidEpochALoadedSamplerYieldsTheRest) {
  const auto whole = as_vector([] {
    ddp::data::DistributedSampler s(50, 3, 2, true, 4);
    s.set_epoch(1);
    return s.indices();
  }());
  std::stringstream saved;
  {
    ddp::data::DistributedSampler sampler(50, 3, 2, true, 4);
    sampler.set_epoch(1);
    auto loader = torch::data::make_data_loader(Numbers(50), sampler, 4);  // no workers
    EXPECT_EQ(pass(*loader, 2), std::vector<int64_t>(whole.begin(), whole.begin() + 8));
    torch::serialize::OutputArchive archive;
    sampler.save(archive);  // position 8: what the loop took, without workers
    archive.save_to(saved);
  }
  // Another rank's sampler (rank 0), of the same order: it takes rank 2's position and yields
  // its own share from there; the epoch comes from the state, set_epoch(1) again keeps it.
  ddp::data::DistributedSampler sampler(50, 3, 0, true, 4);
  torch::serialize::InputArchive archive;
  archive.load_from(saved);
  sampler.load(archive);
  sampler.set_epoch(1);
  auto loader = torch::data::make_data_loader(Numbers(50), sampler, 4);
  const auto own = as_vector(sampler.indices());
  EXPECT_EQ(pass(*loader), std::vector<int64_t>(own.begin() + 8, own.end()));
  EXPECT_EQ(pass(*loader), own);  // the pass after the resumed one is whole again
}

TEST(DistributedSamplerInALoader, LoadRefusesTheStateOfAnotherOrderNamingWhatDiffers) {
  torch::serialize::OutputArchive out;
  ddp::data::DistributedSampler(50, 3, 0, true, 4).save(out);
  std::stringstream saved;
  out.save_to(saved);
  torch::serialize::InputArchive in;
  in.load_from(saved);
  ddp::data::DistributedSampler other(50, 2, 0, true, 4);
  EXPECT_NE(ddp::testing::input_error_of([&] {
              other.load(in);
            }).find("saved with world_size 3, this sampler has 2"),
            std::string::npos);
  ddp::data::DistributedSampler fresh(50, 3, 0, true, 4);
  EXPECT_NE(ddp::testing::input_error_of([&] {
              fresh.save(out, 1);
            }).find("1 indices trained, but the sampler has handed out 0"),
            std::string::npos);
}

TEST(DistributedSamplerInALoader, EvaluationShardsAreUnpaddedInOrder) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto sampler = ddp::data::DistributedSampler::for_evaluation(7, 3, rank);
    auto loader = torch::data::make_data_loader(Numbers(7), sampler, 2);
    EXPECT_EQ(pass(*loader), as_vector(ddp::data::evaluation_indices(7, 3, rank))) << rank;
  }
}

}  // namespace
