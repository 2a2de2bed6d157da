// Which rank is slow, and why (train/straggler.h), on real ranks: one of 2 or 3 made slow from
// outside the product (ddp_fault_train's --slow-rank: its forward, or its fetching of batches,
// waits 20 ms each step), on gloo (the env contract) and under mpirun. Rank 0 names it, with
// the cause, at the first window's end (step 50 of 100); balanced runs name none.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "built_paths.h"
#include "ranks.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;

// 100 steps of the MLP: 6,400 samples (or 6,000 on 3 ranks) at a global batch of 64 (60).
std::vector<std::string> job(const std::string& program, const std::string& out, int world,
                             const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {program,
                                   "--config",
                                   ddp::testing::config("fashion_mnist_mlp.yaml"),
                                   "--data",
                                   DDP_FASHION_MNIST_DIR,
                                   "--train-subset",
                                   world == 3 ? "6000" : "6400",
                                   "--global-batch-size",
                                   world == 3 ? "60" : "64",
                                   "--epochs",
                                   "1",
                                   "--threads",
                                   "1",
                                   "--output-dir",
                                   out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Rank 0's output: the env contract's ranks (gloo) or mpirun's (mpi, one output for all).
std::string run_job(const std::string& backend, int world, const std::vector<std::string>& argv) {
  auto with_backend = argv;
  with_backend.insert(with_backend.end(), {"--backend", backend});
  if (backend == "mpi") {
    const ProcessResult r = ddp::testing::run_mpirun(world, with_backend, seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  }
  const auto ranks = ddp::testing::run_env_ranks(world, with_backend, seconds(120));
  ddp::testing::expect_all_exit_zero(ranks);
  return ranks.empty() ? "" : ranks[0].output;
}

// The epoch's line of metrics.jsonl.
nlohmann::json epoch_metrics(const TempDir& dir) {
  std::istringstream lines(ddp::testing::read_file(dir.file("metrics.jsonl")));
  std::string line;
  std::getline(lines, line);
  return nlohmann::json::parse(line);
}

class SlowRank : public ::testing::TestWithParam<const char*> {};

TEST_P(SlowRank, IsNamedWithinFiftyStepsWithItsCause) {
  const std::string backend = GetParam();
  {  // Rank 1 of 2 computes 20 ms a step longer.
    TempDir out;
    const std::string output =
        run_job(backend, 2,
                job(DDP_FAULT_TRAIN_BIN, out.path(), 2,
                    {"--slow-rank", "1", "--slow-compute", "0.02", "--timeline",
                     out.file("trace.json")}));
    EXPECT_NE(output.find("straggler: rank 1 computes "), std::string::npos) << output;
    EXPECT_NE(output.find("over steps 1-50 (forward+backward+optimizer "), std::string::npos)
        << output;
    EXPECT_NE(output.find("; data and network normal"), std::string::npos) << output;
    EXPECT_EQ(output.find("straggler: rank 0"), std::string::npos) << output;
    const auto m = epoch_metrics(out);
    EXPECT_EQ(m["straggler"]["rank"], 1) << m;
    EXPECT_EQ(m["straggler"]["cause"], "computation") << m;
    ASSERT_EQ(m["rank_step_ms"].size(), 2u) << m;
    // The slow rank computes 20 ms more and, in exchange, waits the least in collectives.
    const auto& fast = m["rank_step_ms"][0];
    const auto& slow = m["rank_step_ms"][1];
    EXPECT_GT(slow["compute"].get<double>(), fast["compute"].get<double>() + 15.0) << m;
    EXPECT_GT(fast["comm"].get<double>(), slow["comm"].get<double>() + 15.0) << m;
    // The end of the run: a table with a row per rank.
    EXPECT_NE(output.find("step times per rank over 100 steps (ms a step):"), std::string::npos)
        << output;
    // The timeline: each rank's two windows as a "step ms" graph; rank 0 marks the naming.
    const auto trace = nlohmann::json::parse(ddp::testing::read_file(out.file("trace.json")));
    std::vector<int> counters(2, 0);
    std::vector<double> compute(2, 0.0);
    std::string marked;
    for (const auto& e : trace.at("traceEvents")) {
      const int pid = e.at("pid").get<int>();
      if (e.at("ph") == "C" && e.at("name") == "step ms") {
        ++counters.at(pid);
        compute.at(pid) = e.at("args").at("compute").get<double>();
      }
      if (e.at("ph") == "i" && pid == 0) marked += e.at("name").get<std::string>();
    }
    EXPECT_EQ(counters, (std::vector<int>{2, 2}));
    EXPECT_GT(compute[1], compute[0] + 15.0);
    EXPECT_EQ(marked.rfind("straggler: rank 1 computes ", 0), 0u) << marked;
  }
  {  // Rank 2 of 3 waits 20 ms a step for its batches: data loading, not computation.
    TempDir out;
    const std::string output = run_job(
        backend, 3,
        job(DDP_FAULT_TRAIN_BIN, out.path(), 3, {"--slow-rank", "2", "--slow-data", "0.02"}));
    EXPECT_NE(output.find("straggler: rank 2 waits "), std::string::npos) << output;
    EXPECT_NE(output.find("longer for data than the median of the other ranks over steps 1-50 "
                          "(data "),
              std::string::npos)
        << output;
    EXPECT_NE(output.find("; computation and network normal"), std::string::npos) << output;
    EXPECT_EQ(output.find("computes "), std::string::npos) << output;
    const auto m = epoch_metrics(out);
    EXPECT_EQ(m["straggler"]["rank"], 2) << m;
    EXPECT_EQ(m["straggler"]["cause"], "data loading") << m;
    ASSERT_EQ(m["rank_step_ms"].size(), 3u) << m;
    EXPECT_GT(m["rank_step_ms"][2]["data"].get<double>(), 15.0) << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SlowRank, ::testing::Values("gloo", "mpi"),
                         [](const auto& info) { return std::string(info.param); });

// Three seeds of the plain ddp_train, 2 ranks on gloo: nobody is named, and the figures are
// written all the same; the third with windows of 150 steps, longer than its run of 100: the
// last window, however short, is exchanged, so its figures and table are there too. Run with no
// other test beside it (ALONE, tests/CMakeLists.txt): its steps take a fraction of a millisecond,
// so a rank kept off its core by another test's ranks for 50 ms of a window is slow indeed, and
// named.
TEST(StragglerRuns, BalancedRunsNameNone) {
  for (const char* seed : {"1", "2", "3"}) {
    TempDir out;
    const bool one_short_window = std::string(seed) == "3";
    std::vector<std::string> extra = {"--seed", seed};
    if (one_short_window) extra.insert(extra.end(), {"--straggler-every", "150"});
    const std::string output = run_job("gloo", 2, job(DDP_TRAIN_BIN, out.path(), 2, extra));
    EXPECT_EQ(output.find("straggler:"), std::string::npos) << "seed " << seed << ":\n" << output;
    const auto m = epoch_metrics(out);
    EXPECT_FALSE(m.contains("straggler")) << m;
    EXPECT_EQ(m["rank_step_ms"].size(), 2u) << m;
    EXPECT_NE(output.find("step times per rank over 100 steps (ms a step):"), std::string::npos)
        << "seed " << seed << ":\n" << output;
  }
}

// --straggler-threshold 0: no exchange, no figures.
TEST(StragglerRuns, ThresholdZeroTurnsItOff) {
  TempDir out;
  const std::string output = run_job(
      "gloo", 2,
      job(DDP_FAULT_TRAIN_BIN, out.path(), 2,
          {"--slow-rank", "1", "--slow-compute", "0.02", "--straggler-threshold", "0"}));
  EXPECT_EQ(output.find("straggler"), std::string::npos) << output;
  EXPECT_EQ(output.find("step times per rank"), std::string::npos) << output;
  EXPECT_FALSE(epoch_metrics(out).contains("rank_step_ms"));
}

}  // namespace
