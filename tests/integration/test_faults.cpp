// Fault injection with real processes under the launcher: a rank killed at a random step (five
// seeds) ends the job within 10 s with no process left, the launcher's diagnosis names it as the
// rank without a flight record, and --resume auto ends where an uninterrupted run ends; a hung
// rank is named by the launcher's merged flight records; a full disk during a save is a clear
// error that leaves the previous checkpoint intact; SIGTERM with --checkpoint-on-signal stops
// every rank after the same step with a checkpoint to resume from.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <random>

#include "built_paths.h"
#include "ddp/train/checkpoint.h"
#include "run_files.h"
#include "subprocess.h"
#include "tensor_compare.h"
#include "train_args.h"

namespace {

using ddp::testing::Child;
using ddp::testing::config;
using ddp::testing::expect_same_weights;
using ddp::testing::launcher_worker_pid;
using ddp::testing::process_alive;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// launcher --nproc 2 ddp_train: the DataParallel tutorial's Linear model, 10 epochs of 4 steps
// (100 samples, 15 per rank and step), a checkpoint after every epoch.
// `fault`: ddp_fault_train's --fault options (tests/support/fault_train.cpp), which then runs
// instead of ddp_train.
std::vector<std::string> launched_linear_job(const std::string& out,
                                             std::vector<std::string> extra = {},
                                             const std::vector<std::string>& fault = {}) {
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN,
                                   "--nproc",
                                   "2",
                                   fault.empty() ? DDP_TRAIN_BIN : DDP_FAULT_TRAIN_BIN,
                                   "--config",
                                   config("random_linear.yaml"),
                                   "--save-every",
                                   "1",
                                   "--output-dir",
                                   out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), fault.begin(), fault.end());
  return argv;
}
constexpr int kSteps = 40;

// The uninterrupted run every interrupted one must end equal to, made once by the first test of
// the process that asks (tests/CMakeLists.txt registers those tests as one ctest test,
// Faults.SharedUninterruptedRun).
const std::string& reference_weights() {
  static TempDir dir;
  static const bool done = [] {
    const auto r = ddp::testing::run_process(launched_linear_job(dir.path()), {}, seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return true;
  }();
  (void)done;
  static const std::string path = dir.file("model.pt");
  return path;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class KillARandomRank : public ::testing::TestWithParam<int> {};

TEST_P(KillARandomRank, TheJobEndsWithin10sAndResumesToTheUninterruptedResult) {
  std::mt19937 pick(static_cast<unsigned>(GetParam()));
  const int rank = static_cast<int>(pick() % 2);
  const int step = 1 + static_cast<int>(pick() % (kSteps - 1));
  SCOPED_TRACE("seed " + std::to_string(GetParam()) + ": SIGKILL to rank " + std::to_string(rank) +
               " after step " + std::to_string(step));
  const std::string reference = reference_weights();

  TempDir out;
  Child job(launched_linear_job(out.path(), {},
                                {"--fault", "kill", "--fault-rank", std::to_string(rank),
                                 "--fault-after-step", std::to_string(step)}),
            {});
  ASSERT_TRUE(job.wait_for_output("fault: SIGKILL after step", Clock::now() + seconds(60)))
      << job.output();
  const auto killed = Clock::now();
  const ProcessResult r = job.wait_until(Clock::now() + seconds(60));
  const auto took = Clock::now() - killed;
  EXPECT_LE(took, seconds(10)) << r.output;
  std::cout << "the job ended "
            << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
            << " ms after the SIGKILL\n";
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(contains(
      r.output, "rank " + std::to_string(rank) + " (local rank " + std::to_string(rank) + ", pid"))
      << r.output;
  for (int rk : {0, 1})
    EXPECT_FALSE(process_alive(launcher_worker_pid(r.output, rk))) << "rank " << rk << " is left";
  // The launcher's hang doctor has at most the survivor's flight record (under load the
  // survivor may end before writing it): never a claim about "every rank", and with the
  // survivor's record, the killed rank named with how it ended.
  const std::string r_text = std::to_string(rank);
  if (contains(r.output, "flight records of 1 of 2 rank(s)")) {
    EXPECT_TRUE(contains(r.output, "no record from rank(s) " + r_text + " (rank " + r_text +
                                       " ended with signal SIGKILL (9))"))
        << r.output;
  }
  for (const char* claim : {"every rank entered", "every rank completed", "no rank lags:"}) {
    EXPECT_FALSE(contains(r.output, claim)) << r.output;
  }

  const auto resumed = ddp::testing::run_process(
      launched_linear_job(out.path(), {"--resume", "auto"}), {}, seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, step > 4 ? "resumed from" : "starting from scratch"))
      << resumed.output;
  expect_same_weights(reference, out.file("model.pt"));
}

INSTANTIATE_TEST_SUITE_P(FiveSeeds, KillARandomRank, ::testing::Values(1, 2, 3, 4, 5));

// The acceptance check of the hang doctor under the launcher: rank 1 is held back where step 3's
// backward begins, before collective #8 (its gradient all-reduce); rank 0 warns after 1 s, gives
// up after 4 s;
// the launcher asks rank 1 for its flight record (SIGUSR1), stops it, and prints the diagnosis.
TEST(Hang, TheLauncherMergesTheFlightRecordsAndNamesTheLateRank) {
  TempDir out;
  const auto r = ddp::testing::run_process(
      launched_linear_job(
          out.path(), {"--comm-timeout", "4", "--stall-warning", "1"},
          {"--fault", "delay:30", "--fault-rank", "1", "--fault-at", "step 3: backward"}),
      {}, seconds(90));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "not entered by rank(s) 1 (at #7)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] the workers' flight records (ddp_train --diagnose):"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "flight records of 2 of 2 rank(s)")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "diagnosis: rank(s) 1 did not enter collective #8 all_reduce(avg) "
                       "(backward: bucket 0), which rank(s) 0 entered; rank 1 was in "
                       "'step 3: backward'"))
      << r.output;
  // The ranks' own copies, for ddp_train --diagnose later.
  EXPECT_TRUE(fs::exists(out.file("debug/rank0.json")));
  EXPECT_TRUE(fs::exists(out.file("debug/rank1.json")));
}

// A save that hits the file size limit (RLIMIT_FSIZE, as a full disk: the write fails) is an
// error naming the file; the previous checkpoint stays the newest and loads.
TEST(FullDisk, AFailedSaveIsAClearErrorAndThePreviousCheckpointIsIntact) {
  TempDir out;
  const std::vector<std::string> mlp = {DDP_TRAIN_BIN,
                                        "--config",
                                        config("fashion_mnist_mlp.yaml"),
                                        "--data",
                                        DDP_FASHION_MNIST_DIR,
                                        "--train-subset",
                                        "1200",
                                        "--output-dir",
                                        out.path()};
  auto first = mlp;
  first.insert(first.end(), {"--epochs", "1"});
  const auto r1 = ddp::testing::run_process(first, {}, seconds(120));
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  ASSERT_GT(fs::file_size(out.file("checkpoint-epoch-0001.pt")), 2u << 20);  // above the limit

  // The same run continued for a second epoch, with files limited to 2 MiB.
  std::string command = "ulimit -f 2048 && exec";
  for (const auto& a : mlp) command += " '" + a + "'";
  command += " --epochs 2 --resume auto";
  const auto r2 = ddp::testing::run_process({"/bin/bash", "-c", command}, {}, seconds(120));
  EXPECT_EQ(r2.exit_code, 1) << r2.output;
  EXPECT_TRUE(contains(r2.output, "saving the checkpoint after epoch 2 failed: " +
                                      out.file("checkpoint-epoch-0002.pt.tmp-")))
      << r2.output;
  EXPECT_TRUE(contains(r2.output,
                       "write failed: File too large (the disk, a quota or the file "
                       "size limit is full"))
      << r2.output;
  EXPECT_FALSE(contains(r2.output, "terminate called")) << r2.output;

  EXPECT_EQ(ddp::train::read_checkpoint(out.file("checkpoint.pt")).epoch, 1);
  EXPECT_FALSE(fs::exists(out.file("checkpoint-epoch-0002.pt")));
  for (const auto& entry : fs::directory_iterator(out.path())) {
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << entry.path();
  }
  // With room again, the run continues from epoch 1.
  auto again = mlp;
  again.insert(again.end(), {"--epochs", "2", "--resume", "auto"});
  const auto r3 = ddp::testing::run_process(again, {}, seconds(120));
  EXPECT_EQ(r3.exit_code, 0) << r3.output;
  EXPECT_EQ(ddp::train::read_checkpoint(out.file("checkpoint.pt")).epoch, 2);
}

// --checkpoint-on-signal: a SIGTERM that reaches only rank 1, after step 6 (the 2nd of epoch 2),
// stops both ranks after that step; rank 0 writes a checkpoint 2 steps into epoch 2; both exit
// 143. --resume auto continues from there and ends bitwise where the uninterrupted run ends.
TEST(CheckpointOnSignal, EveryRankStopsAfterTheSameStepAndTheResumeEndsAsAnUninterruptedRun) {
  const std::string reference = reference_weights();
  TempDir out;
  const auto r = ddp::testing::run_process(
      launched_linear_job(out.path(), {"--checkpoint-on-signal"},
                          {"--fault", "sigterm", "--fault-rank", "1", "--fault-after-step", "6"}),
      {}, seconds(120));
  EXPECT_EQ(r.exit_code, 143) << r.output;
  const std::string saved = out.file("checkpoint-epoch-0001-step-000002.pt");
  EXPECT_TRUE(contains(r.output, "checkpoint 2 steps into epoch 2: " + saved)) << r.output;
  EXPECT_TRUE(contains(r.output, "stopped by SIGTERM after step 6 (2 of epoch 2)")) << r.output;
  const auto c = ddp::train::read_checkpoint(out.file("checkpoint.pt"));
  EXPECT_EQ(c.epoch, 1);
  EXPECT_EQ(c.epoch_step, 2);
  EXPECT_EQ(c.step, 6);

  const auto resumed = ddp::testing::run_process(
      launched_linear_job(out.path(), {"--resume", "auto"}), {}, seconds(120));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + saved +
                                           ": epoch 1, step 6 (2 steps into "
                                           "epoch 2)"))
      << resumed.output;
  expect_same_weights(reference, out.file("model.pt"));
}

// The weights in `a` are those in `b` to within float32 summation order (relative to each
// tensor's largest value).
void expect_close_weights(const std::string& a, const std::string& b) {
  const auto wa = ddp::train::state_dict_from(ddp::train::read_pt_file(a), a);
  const auto wb = ddp::train::state_dict_from(ddp::train::read_pt_file(b), b);
  ASSERT_EQ(wa.size(), wb.size());
  std::vector<torch::Tensor> pa, pb;
  for (size_t i = 0; i < wa.size(); ++i) {
    pa.push_back(wa[i].second);
    pb.push_back(wb[i].second);
  }
  const double error = ddp::testing::max_relative_error(pa, pb);
  std::cout << "max relative error " << error << " (" << a << " vs " << b << ")\n";
  EXPECT_LT(error, 1e-5);
}

// A checkpoint 2 steps into epoch 1 of 3 ranks (the Linear demo, global batch 30: 10 per rank;
// 100 samples padded to 102 by DistributedSampler) holds the epoch's 42 untrained ids, those
// PyTorch's sampler leaves. Resumed on 1 rank (batch 30) or 2 (batch 15), the rest of the epoch
// is those 42 ids in the same global batches, so both runs end where the uninterrupted 3-rank run
// ends (to float32 summation order: the ranks' partial sums differ). The sampler's sequence of 2
// or 1 ranks would have trained 40 ids, not the 42, in the epoch's last step.
TEST(CheckpointOnSignal, AMidEpochCheckpointResumesOnAnotherWorldSizeWithTheEpochsRest) {
  const auto three = [](const std::string& out, const std::vector<std::string>& fault) {
    std::vector<std::string> argv = {DDP_LAUNCHER_BIN,
                                     "--nproc",
                                     "3",
                                     fault.empty() ? DDP_TRAIN_BIN : DDP_FAULT_TRAIN_BIN,
                                     "--config",
                                     config("random_linear.yaml"),
                                     "--epochs",
                                     "1",
                                     "--checkpoint-on-signal",
                                     "--output-dir",
                                     out};
    argv.insert(argv.end(), fault.begin(), fault.end());
    return ddp::testing::run_process(argv, {}, seconds(120));
  };
  TempDir whole, stopped;
  ASSERT_EQ(three(whole.path(), {}).exit_code, 0);
  const auto r =
      three(stopped.path(), {"--fault", "sigterm", "--fault-rank", "1", "--fault-after-step", "2"});
  ASSERT_EQ(r.exit_code, 143) << r.output;
  const std::string saved = stopped.file("checkpoint-epoch-0000-step-000002.pt");
  const auto check = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/epoch_samples.py", saved, "100",
       "3", "0", "0", "60"},
      {}, seconds(120));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_TRUE(contains(check.output, "ok 42")) << check.output;

  for (const char* world : {"1", "2"}) {
    SCOPED_TRACE(std::string("resumed on ") + world + " rank(s)");
    TempDir out;
    const auto resumed =
        ddp::testing::run_process({DDP_LAUNCHER_BIN, "--nproc", world, DDP_TRAIN_BIN, "--config",
                                   config("random_linear.yaml"), "--epochs", "1", "--resume", saved,
                                   "--output-dir", out.path()},
                                  {}, seconds(120));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_TRUE(contains(resumed.output, "epoch 1's 42 untrained samples are shared by " +
                                             std::string(world) + " ranks, not 3"))
        << resumed.output;
    expect_close_weights(out.file("model.pt"), whole.file("model.pt"));
  }
}

// SIGTERM to the launcher (what Slurm and Kubernetes send): it passes it on, the workers
// checkpoint within the grace period, and everything exits 143.
TEST(CheckpointOnSignal, ASigtermToTheLauncherCheckpointsWithinTheGracePeriod) {
  TempDir out;
  Child job({DDP_LAUNCHER_BIN, "--nproc", "2", "--grace-period", "20", DDP_TRAIN_BIN, "--config",
             config("fashion_mnist_mlp.yaml"), "--data", DDP_FASHION_MNIST_DIR, "--train-subset",
             "1200", "--epochs", "200", "--checkpoint-on-signal", "--output-dir", out.path()},
            {});
  ASSERT_TRUE(job.wait_for_output("epoch 1/200", Clock::now() + seconds(120))) << job.output();
  ::kill(job.pid(), SIGTERM);
  const auto sent = Clock::now();
  const ProcessResult r = job.wait_until(Clock::now() + seconds(60));
  EXPECT_LE(Clock::now() - sent, seconds(20)) << r.output;
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(contains(r.output, "stopped by SIGTERM after")) << r.output;
  EXPECT_FALSE(contains(r.output, "did not stop within")) << r.output;  // no SIGKILL needed
  const auto c = ddp::train::read_checkpoint(out.file("checkpoint.pt"));
  EXPECT_GE(c.epoch, 1);
}

}  // namespace
