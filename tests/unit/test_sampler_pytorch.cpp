// DistributedSampler against PyTorch's own: every case of tests/python/sampler_indices.py
// (sizes 1, 7, 100, 1001; worlds 1-5; shuffle; seeds 0 and 42; epochs 0-2; drop_last).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "built_paths.h"
#include "ddp/data/distributed_sampler.h"
#include "subprocess.h"

namespace {

TEST(DistributedSamplerVsPyTorch, EveryCaseGivesPyTorchsIndices) {
  auto r = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/sampler_indices.py"}, {},
      std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  int cases = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto colon = line.find(':');
    ASSERT_NE(colon, std::string::npos) << line;
    std::istringstream head(line.substr(0, colon));
    int64_t size, world, rank, shuffle, seed, epoch, drop_last;
    head >> size >> world >> rank >> shuffle >> seed >> epoch >> drop_last;
    std::vector<int64_t> expected;
    std::istringstream tail(line.substr(colon + 1));
    for (int64_t i; tail >> i;) expected.push_back(i);

    ddp::data::DistributedSampler sampler(size, world, rank, shuffle != 0,
                                          static_cast<uint64_t>(seed), drop_last != 0);
    sampler.set_epoch(epoch);
    const auto got = sampler.indices();
    ASSERT_EQ(got.numel(), sampler.num_samples());
    const std::vector<int64_t> ours(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.numel());
    ASSERT_EQ(ours, expected) << "case " << line.substr(0, colon);
    ++cases;
  }
  EXPECT_EQ(cases,
            4 * 15 * 2 * 2 * 3 * 2);  // every (size, world, rank, shuffle, seed, epoch, drop_last)
}

TEST(DistributedSamplerVsPyTorch, EvaluationShardsCoverEachIndexOnce) {
  for (int64_t size : {1, 7, 100, 1001}) {
    for (int64_t world = 1; world <= 5; ++world) {
      std::vector<int64_t> count(static_cast<size_t>(size), 0);
      for (int64_t rank = 0; rank < world; ++rank) {
        auto idx = ddp::data::evaluation_indices(size, world, rank);
        for (int64_t k = 0; k < idx.numel(); ++k)
          ++count[static_cast<size_t>(idx[k].item<int64_t>())];
      }
      for (int64_t i = 0; i < size; ++i)
        EXPECT_EQ(count[static_cast<size_t>(i)], 1) << size << " " << world;
    }
  }
}

}  // namespace
