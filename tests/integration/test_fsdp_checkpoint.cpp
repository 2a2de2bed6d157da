// ddp_train --fsdp --checkpoint-sharded: each rank writes its shard of every checkpoint in the
// background (or, --checkpoint-async false, before the next step); the checkpoints resume on as
// many ranks bitwise and on another number as the gathered checkpoint of the same run does; a rank
// killed while it writes leaves the previous checkpoint whole, and --resume auto goes on from it.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include "built_paths.h"
#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

namespace fs = std::filesystem;
using ddp::testing::config;
using ddp::testing::TempDir;
using std::chrono::seconds;

// The MLP on 256 Fashion-MNIST samples, Adam, batch 16 per rank (global 32) under --fsdp.
std::vector<std::string> sharded_mlp_job(const TempDir& out, int64_t epochs,
                                         std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {DDP_TRAIN_BIN,
                                   "--config",
                                   config("fashion_mnist_mlp.yaml"),
                                   "--output-dir",
                                   out.path(),
                                   "--progress",
                                   "off",
                                   "--device",
                                   "cpu",
                                   "--fsdp",
                                   "--train-subset",
                                   "256",
                                   "--test-subset",
                                   "64",
                                   "--global-batch-size",
                                   "32",
                                   "--optimizer",
                                   "adam",
                                   "--epochs",
                                   std::to_string(epochs)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

void run_ranks(int ranks, const std::vector<std::string>& argv) {
  ddp::testing::expect_all_exit_zero(ddp::testing::run_env_ranks(ranks, argv, seconds(180)));
}

std::vector<std::string> sharded(std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "--checkpoint-sharded");
  return extra;
}

TEST(FsdpCheckpoint, ShardedCheckpointsResumeBitwiseOnAsManyRanksAndOnAnotherAsTheGatheredOne) {
  TempDir whole, split, gathered;
  run_ranks(2, sharded_mlp_job(whole, 3, sharded()));
  // Written before each next step, from the state itself (the run above: in the background).
  run_ranks(
      2, sharded_mlp_job(split, 2, sharded({"--keep-last", "1", "--checkpoint-async", "false"})));
  // Each rank's file, in a directory per checkpoint; keep-last 1 deleted epoch 1's once epoch 2's
  // was whole.
  EXPECT_TRUE(fs::exists(split.file("checkpoint-epoch-0002.shards/rank-00000-of-00002.pt")));
  EXPECT_TRUE(fs::exists(split.file("checkpoint-epoch-0002.shards/rank-00001-of-00002.pt")));
  EXPECT_FALSE(fs::exists(split.file("checkpoint-epoch-0001.shards")));
  run_ranks(2,
            sharded_mlp_job(gathered, 2));  // the same training, its checkpoint gathered on rank 0
  // Epoch 3 on 4 ranks from either checkpoint, then on 2 from the sharded one.
  TempDir four_sharded, four_gathered;
  run_ranks(4, sharded_mlp_job(four_sharded, 3,
                               sharded({"--resume", split.file("checkpoint-epoch-0002.shards")})));
  run_ranks(4, sharded_mlp_job(four_gathered, 3,
                               {"--resume", gathered.file("checkpoint-epoch-0002.pt")}));
  ddp::testing::expect_same_weights(four_sharded.file("model.pt"), four_gathered.file("model.pt"));
  run_ranks(2, sharded_mlp_job(split, 3, sharded({"--resume", "auto"})));
  ddp::testing::expect_same_weights(split.file("model.pt"), whole.file("model.pt"));
}

// The pid of a process (not `except`) that has a file open whose path contains `part`; -1.
int pid_writing(const std::string& part) {
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", fd_ec)) {
      std::error_code link_ec;
      if (fs::read_symlink(fd.path(), link_ec).string().find(part) != std::string::npos) {
        return std::stoi(pid);
      }
    }
  }
  return -1;
}

// Each 64 KiB of an atomic write takes 40 ms more (tests/support/slow_writes.c, preloaded): a
// rank's file of the MLP (about 1 MB) takes over half a second, during which rank 1 is killed.
TEST(FsdpCheckpoint, ARankKilledWhileItWritesLeavesThePreviousCheckpointWhole) {
  TempDir reference, out;
  run_ranks(2, sharded_mlp_job(reference, 3, sharded()));
  auto argv = sharded_mlp_job(out, 3, sharded());
  argv.insert(argv.begin(), {DDP_LAUNCHER_BIN, "--nproc", "2"});
  ddp::testing::Child child(argv,
                            {{"LD_PRELOAD", DDP_SLOW_WRITES_LIB}, {"DDP_SLOW_WRITES_MS", "40"}});
  const auto deadline = std::chrono::steady_clock::now() + seconds(120);
  const std::string second = out.file("checkpoint-epoch-0002.shards/rank-00001-of-00002.pt.tmp-");
  int writer = -1;
  while (writer < 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    writer = pid_writing(second);
  }
  ASSERT_GT(writer, 0) << "rank 1 never wrote its file of epoch 2\n" << child.output();
  ::kill(writer, SIGKILL);
  const auto killed = child.wait_until(deadline);
  EXPECT_NE(killed.exit_code, 0) << killed.output;

  EXPECT_FALSE(fs::exists(out.file("checkpoint-epoch-0002.shards/rank-00001-of-00002.pt")));
  EXPECT_TRUE(fs::exists(out.file("checkpoint-epoch-0001.shards/rank-00000-of-00002.pt")));
  EXPECT_TRUE(fs::exists(out.file("checkpoint-epoch-0001.shards/rank-00001-of-00002.pt")));
  const auto resumed = ddp::testing::run_env_ranks(
      2, sharded_mlp_job(out, 3, sharded({"--resume", "auto"})), seconds(180));
  ddp::testing::expect_all_exit_zero(resumed);
  // (Rank 0's file may be missing too: the launcher stops it when rank 1 dies.)
  EXPECT_NE(resumed[0].output.find("skipping " + out.file("checkpoint-epoch-0002.shards") +
                                   ": an incomplete sharded checkpoint"),
            std::string::npos)
      << resumed[0].output;
  EXPECT_NE(resumed[0].output.find("resumed from " + out.file("checkpoint-epoch-0001.shards")),
            std::string::npos)
      << resumed[0].output;
  ddp::testing::expect_same_weights(out.file("model.pt"), reference.file("model.pt"));
}

// Hosts that each have their own directory under the same path (not a shared file system),
// made here by a wrapper that gives each rank a directory of its own: --checkpoint-sharded is
// refused at the start on every rank, naming the directory and the ranks that do not share it,
// before anything is trained (a sharded checkpoint there could never be resumed).
TEST(FsdpCheckpoint, AnOutputDirectoryTheRanksDoNotShareIsRefusedAtTheStart) {
  TempDir base;
  const std::vector<std::string> job = sharded_mlp_job(base, 1, sharded());
  std::vector<std::string> argv = {"/bin/sh", "-c",
                                   "d=\"$1/rank-$RANK\"; shift; mkdir -p \"$d\"; "
                                   "exec \"$@\" --output-dir \"$d\"",
                                   "sh", base.path()};
  for (size_t i = 0; i < job.size(); ++i) {
    if (job[i] == "--output-dir") {
      ++i;  // the wrapper's instead
    } else {
      argv.push_back(job[i]);
    }
  }
  const auto ranks = ddp::testing::run_env_ranks(2, argv, seconds(120));
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_NE(ranks[r].exit_code, 0) << ranks[r].output;
    EXPECT_NE(ranks[r].output.find("--checkpoint-sharded: the output directory '" + base.path() +
                                   "/rank-" + std::to_string(r) +
                                   "' is not the same directory on every rank: rank(s) 1 do not "
                                   "see the file rank 0 wrote there"),
              std::string::npos)
        << ranks[r].output;
  }
  EXPECT_FALSE(fs::exists(base.file("rank-0/model.pt")));
  for (const auto& entry : fs::directory_iterator(base.file("rank-0"))) {
    EXPECT_EQ(entry.path().filename().string().rfind(".ddp-shared-", 0), std::string::npos)
        << "rank 0's check file was left behind: " << entry.path();
  }
}

}  // namespace
