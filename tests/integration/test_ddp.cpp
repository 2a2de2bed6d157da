// DistributedDataParallel with real ranks (gloo with the env contract, mpi with mpirun):
// N ranks with batch B equal one process with batch N * B; no_sync; Adam; compression;
// unused parameters; mismatched models; overlap of all-reduce with backward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>

#include "built_paths.h"
#include "ranks.h"

namespace {

using ddp::testing::ProcessResult;
using Clock = std::chrono::steady_clock;

std::vector<ProcessResult> gloo_job(int world, const std::string& scenario) {
  return ddp::testing::run_env_ranks(world, {DDP_DDP_WORKER_BIN, "gloo", scenario},
                                     std::chrono::seconds(120));
}

void expect_all_pass(const std::vector<ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find(fmt::format("rank {}/{}: ", r, results.size())),
              std::string::npos)
        << results[r].output;
  }
}

struct Case {
  int world;
  std::string scenario;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.scenario << " on " << c.world << " ranks";
}

class GlooDdp : public ::testing::TestWithParam<Case> {};

TEST_P(GlooDdp, EqualsOneProcessWithTheGlobalBatch) {
  expect_all_pass(gloo_job(GetParam().world, GetParam().scenario));
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, GlooDdp,
    ::testing::Values(Case{2, "sgd"}, Case{3, "sgd"}, Case{2, "nosync"}, Case{3, "nosync"},
                      Case{2, "adam"}, Case{3, "adam"}, Case{2, "fp16"}, Case{2, "bf16"},
                      Case{3, "bf16"}, Case{2, "custom-hook"}, Case{3, "powersgd-warmup"},
                      Case{2, "bucket-view"}, Case{3, "bucket-view"}, Case{2, "unused-find"},
                      Case{3, "unused-find"}, Case{2, "two-forwards"}, Case{3, "two-forwards"},
                      Case{2, "checkpoint-twice"}, Case{3, "checkpoint-twice"},
                      Case{2, "grad-scaler"}, Case{3, "grad-scaler"}, Case{2, "zero"},
                      Case{3, "zero"}, Case{2, "signatures"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.scenario + "_world" + std::to_string(info.param.world);
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

class MpiDdp : public ::testing::TestWithParam<Case> {};

TEST_P(MpiDdp, EqualsOneProcessWithTheGlobalBatch) {
  const auto& c = GetParam();
  auto r = ddp::testing::run_mpirun(c.world, {DDP_DDP_WORKER_BIN, "mpi", c.scenario},
                                    std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < c.world; ++rank) {
    EXPECT_NE(r.output.find(fmt::format("rank {}/{}: ", rank, c.world)), std::string::npos)
        << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, MpiDdp,
                         ::testing::Values(Case{2, "sgd"}, Case{3, "sgd"}, Case{2, "nosync"},
                                           Case{3, "nosync"}, Case{2, "adam"}, Case{3, "adam"},
                                           Case{2, "fp16"}, Case{3, "bf16"}, Case{2, "custom-hook"},
                                           Case{2, "two-forwards"}, Case{2, "checkpoint-twice"},
                                           Case{3, "grad-scaler"}, Case{2, "zero"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name =
                               info.param.scenario + "_world" + std::to_string(info.param.world);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Ddp, BucketsAreRebuiltOnceFromTheObservedOrder) {
  const auto results = gloo_job(2, "sgd");
  expect_all_pass(results);
  EXPECT_NE(results[0].output.find("(rebuilt)"), std::string::npos) << results[0].output;
}

// ddp_train --clip-grad-norm's clipping on the reduced gradients: 2 ranks equal one process with
// the global batch (to 1e-5 after 5 steps), and PyTorch's torch.nn.utils.clip_grad_norm_ on the
// same reduced gradients gives the same norm and the same clipped gradients.
TEST(Ddp, ClippingTheReducedGradientsEqualsPyTorchsClipGradNorm) {
  ddp::testing::TempDir dir;
  const auto record = dir.file("clip.pt");
  expect_all_pass(ddp::testing::run_env_ranks(2, {DDP_DDP_WORKER_BIN, "gloo", "clip", record},
                                              std::chrono::seconds(120)));
  const auto r = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/clip_check.py", record}, {},
      std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("clipped gradients differ by"), std::string::npos) << r.output;
}

TEST(Ddp, UnusedParametersWithoutTheOptionAreNamed) {
  const auto start = Clock::now();
  const auto results = gloo_job(2, "unused");
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(
        r.output.find(
            "2 parameter(s) got no gradient in this iteration: 'unused.weight', 'unused.bias'"),
        std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("find_unused_parameters"), std::string::npos) << r.output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

// A checkpointed block used twice gives its parameters two gradients per backward: without
// static_graph every rank stops at the first backward with a message that names the way out.
TEST(Ddp, ACheckpointedBlockUsedTwiceWithoutStaticGraphIsNamed) {
  const auto start = Clock::now();
  const auto results = gloo_job(2, "checkpoint-twice-dynamic");
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("parameter 'block."), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("got its gradient twice in one backward; when a backward runs again "
                            "inside it (activation checkpointing, a block used twice), enable "
                            "static_graph"),
              std::string::npos)
        << r.output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST(Ddp, MismatchedModelsFailOnEveryRankWithinSeconds) {
  const auto start = Clock::now();
  const auto results = gloo_job(2, "mismatch");
  EXPECT_EQ(results[1].exit_code, 2) << results[1].output;
  EXPECT_NE(results[1].output.find(
                "rank 1: the model differs from rank 0's (6 parameters here, 6 there): "
                "parameter 0 is 'a.weight' [33, 8] float32 here but 'a.weight' [32, 8] "
                "float32 on rank 0"),
            std::string::npos)
      << results[1].output;
  EXPECT_EQ(results[0].exit_code, 2) << results[0].output;
  EXPECT_NE(results[0].output.find(
                "rank 0: the model differs across ranks: rank(s) 1 hold other parameters"),
            std::string::npos)
      << results[0].output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

std::string buffer_checksum(const ProcessResult& r) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.output, m, std::regex("buffer checksum (-?[0-9.]+)")))
      << r.output;
  return m.size() > 1 ? m[1].str() : "";
}

TEST(Ddp, BroadcastBuffersGivesEveryRankRankZerosBatchNormStatistics) {
  auto with = gloo_job(3, "buffers");
  expect_all_pass(with);
  EXPECT_EQ(buffer_checksum(with[1]), buffer_checksum(with[0]));
  EXPECT_EQ(buffer_checksum(with[2]), buffer_checksum(with[0]));
  auto without = gloo_job(2, "no-buffers");
  expect_all_pass(without);
  EXPECT_NE(buffer_checksum(without[1]), buffer_checksum(without[0]));  // each rank's own batches
}

TEST(Ddp, FirstBucketIsLaunchedBeforeBackwardEnds) {
  const auto results = gloo_job(2, "overlap");
  expect_all_pass(results);
  for (const auto& r : results) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m,
                                  std::regex("(\\d+) buckets; first launched (-?\\d+) us before")))
        << r.output;
    EXPECT_GE(std::stoi(m[1]), 3) << r.output;
    EXPECT_GT(std::stol(m[2]), 0) << r.output;
    EXPECT_EQ(r.output.find("OUT OF ORDER"), std::string::npos) << r.output;
  }
}

// DiLoCo and local SGD (ddp/core/diloco.h) on real ranks: rank r replays replica r of the Python
// reference written from the paper's Algorithm 1 (tests/python/diloco_reference.py, torch.optim.SGD
// with Nesterov momentum as the outer optimizer), also with a delay (the all-reduce in flight
// during the last steps of each round); the outer gradient is averaged by an all-reduce among the
// ranks, and every round's global parameters equal the reference's to 1e-6.
TEST(DiLoCo, RealRanksAverageTheirOuterGradientAsThePaper) {
  for (int world : {2, 3}) {
    ddp::testing::TempDir dir;
    const auto file = dir.file("reference.pt");
    const auto python = ddp::testing::run_process(
        {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/diloco_reference.py", file,
         std::to_string(world)},
        {}, std::chrono::seconds(120));
    ASSERT_EQ(python.exit_code, 0) << python.output;
    const auto results = ddp::testing::run_env_ranks(
        world, {DDP_DDP_WORKER_BIN, "gloo", "diloco", file}, std::chrono::seconds(120));
    ASSERT_EQ(results.size(), static_cast<size_t>(world));
    for (size_t r = 0; r < results.size(); ++r) {
      EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
      for (const char* variant : {"diloco", "local_sgd", "diloco_delayed"}) {
        EXPECT_NE(results[r].output.find(fmt::format("rank {}: {} round 3: ", r, variant)),
                  std::string::npos)
            << results[r].output;
      }
    }
  }
}

}  // namespace
