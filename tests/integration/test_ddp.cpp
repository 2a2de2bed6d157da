// DistributedDataParallel with real ranks (gloo and shm with the env contract, mpi with mpirun):
// N ranks with batch B equal one process with batch N * B; no_sync; Adam; compression;
// unused parameters; mismatched models; overlap of all-reduce with backward.
//
// The scenarios that look inside one process group share one launch of ranks per backend and
// world size (support/scenarios.h): each test asserts its own scenario's lines, and tests/
// CMakeLists.txt registers the tests of one launch as one ctest test (GlooDdp.OneLaunchPerWorld,
// ShmDdp.OneLaunchPerWorld, MpiDdp.OneLaunchPerWorld). A launch of its own is kept where a test
// looks at a process boundary (the exit code of a refused model), or crosses to PyTorch.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>

#include "built_paths.h"
#include "ranks.h"
#include "scenarios.h"

namespace {

using ddp::testing::ProcessResult;
using ddp::testing::scenario_lines;
using Clock = std::chrono::steady_clock;

std::vector<ProcessResult> gloo_job(int world, const std::string& scenario) {
  return ddp::testing::run_env_ranks(world, {DDP_DDP_WORKER_BIN, "gloo", scenario},
                                     std::chrono::seconds(120));
}

// Each rank's exit code is 0, and it printed "rank r/world: ".
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
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.scenario + "_world" + std::to_string(info.param.world);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// The scenarios each launch runs: the tests' cases, and on gloo the scenarios of the Ddp tests
// below that look inside the group (overlap, buffers).
const std::map<int, std::vector<std::string>> kGlooScenarios = {
    {2,
     {"sgd", "nosync", "adam", "fp16", "bf16", "custom-hook", "bucket-view", "unused-find",
      "two-forwards", "checkpoint-twice", "grad-scaler", "zero", "signatures", "overlap",
      "no-buffers"}},
    {3,
     {"sgd", "nosync", "adam", "bf16", "powersgd-warmup", "bucket-view", "unused-find",
      "two-forwards", "checkpoint-twice", "grad-scaler", "zero", "buffers"}}};
const std::map<int, std::vector<std::string>> kMpiScenarios = {
    {2, {"sgd", "nosync", "adam", "fp16", "custom-hook", "two-forwards", "checkpoint-twice", "zero"}},
    {3, {"sgd", "nosync", "adam", "bf16", "grad-scaler"}}};
// On shared memory (over gloo), whose all-reduces read DDP's buckets in place: they lie in the
// group's buffers (ProcessGroup::allocate_buffer).
const std::map<int, std::vector<std::string>> kShmScenarios = {
    {2, {"sgd", "nosync", "bucket-view", "unused-find", "adam", "bf16"}},
    {3, {"sgd", "nosync", "bucket-view", "unused-find", "adam", "bf16"}}};
const std::vector<std::string> kGlooOnly = {"overlap", "no-buffers", "buffers"};

std::vector<Case> cases_of(const std::map<int, std::vector<std::string>>& scenarios) {
  std::vector<Case> cases;
  for (const auto& [world, names] : scenarios) {
    for (const auto& name : names) {
      if (std::find(kGlooOnly.begin(), kGlooOnly.end(), name) == kGlooOnly.end())
        cases.push_back({world, name});
    }
  }
  return cases;
}

// The words of one launch of `world` ranks on `backend`: every scenario of that world.
std::vector<std::string> launch_words(const std::string& backend,
                                      const std::map<int, std::vector<std::string>>& scenarios,
                                      int world) {
  std::vector<std::string> words = {DDP_DDP_WORKER_BIN, backend};
  const auto& names = scenarios.at(world);
  words.insert(words.end(), names.begin(), names.end());
  return words;
}

// One gloo launch and one shm launch per world size, and one mpirun launch (every rank's lines
// in one output).
const std::vector<ProcessResult>& gloo_launch(int world) {
  return ddp::testing::once_per_world(world, [](int w) {
    return ddp::testing::run_env_ranks(w, launch_words("gloo", kGlooScenarios, w),
                                       std::chrono::seconds(300));
  });
}
const std::vector<ProcessResult>& shm_launch(int world) {
  return ddp::testing::once_per_world(world, [](int w) {
    return ddp::testing::run_env_ranks(w, launch_words("shm", kShmScenarios, w),
                                       std::chrono::seconds(300));
  });
}
const ProcessResult& mpi_launch(int world) {
  return ddp::testing::once_per_world(world, [](int w) {
    return ddp::testing::run_mpirun(w, launch_words("mpi", kMpiScenarios, w),
                                    std::chrono::seconds(300));
  });
}

using ddp::testing::scenario_message;

// In a shared launch: `scenario` ended with exit 0 on every rank, each having printed
// "rank r/world: ". Returns each rank's lines of it.
std::vector<std::string> expect_scenario_passes(const std::vector<ProcessResult>& ranks,
                                                const std::string& scenario) {
  std::vector<std::string> lines;
  for (size_t r = 0; r < ranks.size(); ++r) {
    lines.push_back(scenario_lines(ranks[r].output, scenario));
    const std::string message = scenario_message(ranks[r].output, scenario);
    EXPECT_FALSE(ranks[r].timed_out) << "rank " << r << ":\n" << message;
    EXPECT_NE(lines[r].find(fmt::format("rank {}: exit 0\n", r)), std::string::npos)
        << "rank " << r << ":\n" << message;
    EXPECT_NE(lines[r].find(fmt::format("rank {}/{}: ", r, ranks.size())), std::string::npos)
        << "rank " << r << ":\n" << message;
  }
  return lines;
}

class GlooDdp : public ::testing::TestWithParam<Case> {};

TEST_P(GlooDdp, EqualsOneProcessWithTheGlobalBatch) {
  expect_scenario_passes(gloo_launch(GetParam().world), GetParam().scenario);
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GlooDdp, ::testing::ValuesIn(cases_of(kGlooScenarios)),
                         case_name);

class ShmDdp : public ::testing::TestWithParam<Case> {};

// bucket-view: the gradients, views of DDP's buckets, lie in the group's shared memory.
TEST_P(ShmDdp, EqualsOneProcessWithTheGlobalBatch) {
  const auto lines = expect_scenario_passes(shm_launch(GetParam().world), GetParam().scenario);
  if (GetParam().scenario != "bucket-view") return;
  for (size_t r = 0; r < lines.size(); ++r) {
    EXPECT_TRUE(std::regex_search(lines[r], std::regex("rank [0-9]+: ([0-9]+) of \\1 gradients in "
                                                       "the group's shared memory")))
        << lines[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, ShmDdp, ::testing::ValuesIn(cases_of(kShmScenarios)),
                         case_name);

class MpiDdp : public ::testing::TestWithParam<Case> {};

TEST_P(MpiDdp, EqualsOneProcessWithTheGlobalBatch) {
  const auto& c = GetParam();
  const ProcessResult& r = mpi_launch(c.world);
  const std::string lines = scenario_lines(r.output, c.scenario);
  const std::string message = scenario_message(r.output, c.scenario);
  EXPECT_FALSE(r.timed_out) << message;
  for (int rank = 0; rank < c.world; ++rank) {
    EXPECT_NE(lines.find(fmt::format("rank {}: exit 0\n", rank)), std::string::npos) << message;
    EXPECT_NE(lines.find(fmt::format("rank {}/{}: ", rank, c.world)), std::string::npos)
        << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, MpiDdp, ::testing::ValuesIn(cases_of(kMpiScenarios)),
                         case_name);

TEST(Ddp, BucketsAreRebuiltOnceFromTheObservedOrder) {
  const auto lines = expect_scenario_passes(gloo_launch(2), "sgd");
  EXPECT_NE(lines[0].find("(rebuilt)"), std::string::npos) << lines[0];
}

// ddp_train --clip-grad-norm's clipping on the reduced gradients: 2 ranks equal one process with
// the global batch (to 1e-5 after 5 steps), and PyTorch's torch.nn.utils.clip_grad_norm_ on the
// same reduced gradients gives the same norm and the same clipped gradients.
TEST(Ddp, ClippingTheReducedGradientsEqualsPyTorchsClipGradNorm) {
  ddp::testing::TempDir dir;
  const auto record = dir.file("clip.pt");
  expect_all_pass(ddp::testing::run_env_ranks(
      2, {DDP_DDP_WORKER_BIN, "gloo", "clip=" + record}, std::chrono::seconds(120)));
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

std::string buffer_checksum(const std::string& lines) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(lines, m, std::regex("buffer checksum (-?[0-9.]+)"))) << lines;
  return m.size() > 1 ? m[1].str() : "";
}

TEST(Ddp, BroadcastBuffersGivesEveryRankRankZerosBatchNormStatistics) {
  const auto with = expect_scenario_passes(gloo_launch(3), "buffers");
  EXPECT_EQ(buffer_checksum(with[1]), buffer_checksum(with[0]));
  EXPECT_EQ(buffer_checksum(with[2]), buffer_checksum(with[0]));
  const auto without = expect_scenario_passes(gloo_launch(2), "no-buffers");
  EXPECT_NE(buffer_checksum(without[1]), buffer_checksum(without[0]));  // each rank's own batches
}

TEST(Ddp, FirstBucketIsLaunchedBeforeBackwardEnds) {
  for (const auto& lines : expect_scenario_passes(gloo_launch(2), "overlap")) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(lines, m,
                                  std::regex("(\\d+) buckets; first launched (-?\\d+) us before")))
        << lines;
    EXPECT_GE(std::stoi(m[1]), 3) << lines;
    EXPECT_GT(std::stol(m[2]), 0) << lines;
    EXPECT_EQ(lines.find("OUT OF ORDER"), std::string::npos) << lines;
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
        world, {DDP_DDP_WORKER_BIN, "gloo", "diloco=" + file}, std::chrono::seconds(120));
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
