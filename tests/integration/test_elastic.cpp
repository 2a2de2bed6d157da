// Elastic training under `launcher --nnodes 1:1`: a worker SIGKILLed at a random step (five
// seeds) leaves the others training without a restart; the step in flight is dropped, the group
// re-forms smaller, the restarted worker joins at a later step, and the job ends with exit 0.
// Its weights equal, bitwise, those of the same training done by checkpoints: 3 ranks stopped
// after the last committed step, resumed on 2 until the step where the worker joined, resumed on
// 3 to the end. So nothing was applied twice or half, and every sample of the interrupted epoch
// was trained once (the checkpoints' rest of the epoch, checked against PyTorch's sampler in
// CheckpointOnSignal.AMidEpochCheckpointResumesOnAnotherWorldSizeWithTheEpochsRest).
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::config;
using ddp::testing::expect_same_weights;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;

constexpr int kEpochs = 80;  // of 4 steps (the Linear demo: 100 samples, global batch 30)

// `launcher LAUNCH... PROGRAM --config random_linear.yaml --epochs 80 --output-dir OUT EXTRA...`
ProcessResult run_linear(const std::vector<std::string>& launch, const char* program,
                         const std::string& out, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN};
  argv.insert(argv.end(), launch.begin(), launch.end());
  argv.insert(argv.end(), {program, "--config", config("random_linear.yaml"), "--epochs",
                           std::to_string(kEpochs), "--output-dir", out});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return ddp::testing::run_process(argv, {}, seconds(120));
}

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

class KillAnElasticWorker : public ::testing::TestWithParam<int> {};

TEST_P(KillAnElasticWorker, TheOthersGoOnTheRestartedOneJoinsAndTheResultIsTheCheckpointedOne) {
  std::mt19937 pick(static_cast<unsigned>(GetParam()));
  const int rank = static_cast<int>(pick() % 3);
  const int step = 1 + static_cast<int>(pick() % 40);
  const std::string victim = std::to_string(rank) + ".0";
  SCOPED_TRACE("seed " + std::to_string(GetParam()) + ": SIGKILL to rank " + std::to_string(rank) +
               " after step " + std::to_string(step));

  TempDir elastic;
  const ProcessResult r =
      run_linear({"--nnodes", "1:1", "--nproc", "3", "--max-restarts", "2"}, DDP_FAULT_TRAIN_BIN,
                 elastic.path(),
                 {"--elastic", "--fault", "kill", "--fault-rank", std::to_string(rank),
                  "--fault-after-step", std::to_string(step)});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The lost worker is named; it alone was restarted (the survivors kept their processes), and
  // it joined: the generations were 3, then 2, then 3 workers.
  EXPECT_TRUE(mentions(r.output, "elastic: worker " + victim)) << r.output;
  EXPECT_TRUE(mentions(r.output, "lost: signal SIGKILL (9); generation 1 of 2 worker(s)"))
      << r.output;
  EXPECT_EQ(count_of(r.output, "[launcher] elastic: restart "), 1) << r.output;
  EXPECT_TRUE(mentions(r.output, "elastic: restart 1 of 2: worker " + std::to_string(rank) + ".1"))
      << r.output;
  EXPECT_TRUE(mentions(r.output, "[launcher] elastic: generation 2 of 3 worker(s)")) << r.output;
  // The step in flight was dropped (or, at an epoch's end, its metrics' all-reduce failed): the
  // smaller group goes on after the last step all had committed.
  EXPECT_TRUE(mentions(r.output, "generation 1: 2 rank(s) (") &&
              mentions(r.output, "going on after step " + std::to_string(step) + " ("))
      << r.output;

  // Where the joiner came in: "a worker joins in generation 1 of 2 rank(s); ... going on after
  // step J".
  std::smatch joined;
  const std::regex joins(
      "a worker joins in generation 1 of 2 rank\\(s\\); [^\\n]* after step (\\d+)");
  ASSERT_TRUE(std::regex_search(r.output, joined, joins)) << r.output;
  const std::string join_step = joined[1];

  // The same training by checkpoints: 3 ranks stopped after `step`, 2 ranks resumed to the join
  // step, 3 ranks resumed to the end.
  TempDir checkpoints;
  const auto stop_at = [](int s) {
    return std::vector<std::string>{"--checkpoint-on-signal", "--fault", "sigterm",
                                    "--fault-after-step", std::to_string(s)};
  };
  const int joined_at = std::stoi(join_step);
  EXPECT_EQ(run_linear({"--nproc", "3"}, DDP_FAULT_TRAIN_BIN, checkpoints.path(), stop_at(step))
                .exit_code,
            143);
  auto two = stop_at(joined_at);
  two.insert(two.end(), {"--resume", "auto"});
  if (joined_at > step) {
    EXPECT_EQ(run_linear({"--nproc", "2"}, DDP_FAULT_TRAIN_BIN, checkpoints.path(), two).exit_code,
              143);
  }
  const ProcessResult last =
      run_linear({"--nproc", "3"}, DDP_TRAIN_BIN, checkpoints.path(), {"--resume", "auto"});
  ASSERT_EQ(last.exit_code, 0) << last.output;
  expect_same_weights(elastic.file("model.pt"), checkpoints.file("model.pt"));
}

INSTANTIATE_TEST_SUITE_P(FiveSeeds, KillAnElasticWorker, ::testing::Values(1, 2, 3, 4, 5));

// Without a restart the two survivors finish the job; a worker killed with no one left to finish
// it ends the job non-zero.
TEST(Elastic, WithoutRestartsTheSurvivorsFinishAndWithNoneLeftTheJobFails) {
  TempDir out;
  const ProcessResult r =
      run_linear({"--nnodes", "1:1", "--nproc", "3"}, DDP_FAULT_TRAIN_BIN, out.path(),
                 {"--elastic", "--fault", "kill", "--fault-rank", "0", "--fault-after-step", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(mentions(r.output, "generation 1 of 2 worker(s): 1.0,2.0")) << r.output;
  EXPECT_TRUE(mentions(r.output, "done: " + std::to_string(kEpochs) + " epochs")) << r.output;
  // Rank 0 died in epoch 1: the new rank 0 wrote every epoch's metrics, each once.
  EXPECT_EQ(count_of(ddp::testing::read_file(out.file("metrics.jsonl")), "\"epoch\":"), kEpochs);

  TempDir alone;
  const ProcessResult one =
      run_linear({"--nnodes", "1:1", "--nproc", "1"}, DDP_FAULT_TRAIN_BIN, alone.path(),
                 {"--elastic", "--fault", "kill", "--fault-rank", "0", "--fault-after-step", "3"});
  EXPECT_EQ(one.exit_code, 137) << one.output;
  EXPECT_TRUE(mentions(one.output, "no worker of the job is left")) << one.output;
}

// --elastic where it cannot work is refused at start, naming why.
TEST(Elastic, MpiZeroAndAPlainLaunchAreRefused) {
  TempDir out;
  const auto refused = [&](const std::vector<std::string>& launch, std::vector<std::string> extra,
                           const std::string& why) {
    extra.insert(extra.begin(), "--elastic");
    const ProcessResult r = run_linear(launch, DDP_TRAIN_BIN, out.path(), extra);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(mentions(r.output, why)) << r.output;
  };
  refused({"--nnodes", "1:1", "--nproc", "2"}, {"--zero"},
          "key 'elastic': cannot be combined with zero (a lost rank's optimizer shard would be "
          "lost)");
  refused({"--nnodes", "1:1", "--nproc", "2"}, {"--backend", "mpi"},
          "key 'elastic': backend 'mpi' cannot survive a lost rank");
  refused({"--nproc", "2"}, {}, "key 'elastic': start ddp_train under launcher --nnodes MIN:MAX");
}

}  // namespace
