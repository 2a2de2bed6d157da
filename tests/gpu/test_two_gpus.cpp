// Two ranks on two GPUs, one each (cuda:LOCAL_RANK), as real processes: the nccl backend's
// collectives at world size 2 against closed forms, DistributedDataParallel against one GPU with
// the doubled batch, and ddp_train's Fashion-MNIST MLP under the launcher (against one GPU with
// the doubled batch) and under mpirun (against the launcher), and --elastic on nccl (a rank killed,
// restarted and healed while the other goes on). NCCL refuses two ranks on one GPU, so
// each test skips, saying why, where fewer than two GPUs are visible or the nccl backend is not
// built; the mpirun test also where configuring found no mpirun.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "built_paths.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"
#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"

namespace {

using ddp::testing::last_metrics;
using ddp::testing::metrics_field;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;

// Why these tests cannot run here, or "" when they can.
std::string two_gpus_skip_reason() {
#ifndef DDP_HAVE_NCCL
  return "nccl backend not compiled in: LibTorch has no CUDA";
#else
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (gpus < 2) {
    return fmt::format(
        "{} CUDA GPU(s) visible; two-GPU tests need two (NCCL refuses two ranks on one GPU)", gpus);
  }
  return "";
#endif
}

#define SKIP_WITHOUT_TWO_GPUS()                        \
  do {                                                 \
    const std::string reason = two_gpus_skip_reason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;       \
  } while (0)

// Each rank exited 0 and said who it was: "rank R/2 on cuda:R: ".
void expect_both_ranks_pass(const std::vector<ProcessResult>& ranks) {
  ASSERT_EQ(ranks.size(), 2u);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
    EXPECT_NE(ranks[r].output.find(fmt::format("rank {}/2 on cuda:{}: ", r, r)), std::string::npos)
        << ranks[r].output;
  }
}

TEST(TwoGpus, NcclCollectivesMatchTheirClosedForms) {
  SKIP_WITHOUT_TWO_GPUS();
  const auto ranks =
      ddp::testing::run_env_ranks(2, {DDP_TWO_GPU_WORKER_BIN, "collectives"}, seconds(240));
  expect_both_ranks_pass(ranks);
  for (const auto& r : ranks) {
    EXPECT_NE(r.output.find(" checks, 0 failures"), std::string::npos) << r.output;
  }
}

TEST(TwoGpus, DdpEqualsOneGpuWithTheDoubledBatch) {
  SKIP_WITHOUT_TWO_GPUS();
  const auto ranks = ddp::testing::run_env_ranks(2, {DDP_TWO_GPU_WORKER_BIN, "ddp"}, seconds(120));
  expect_both_ranks_pass(ranks);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_NE(ranks[r].output.find(fmt::format("parameters on cuda:{}", r)), std::string::npos)
        << ranks[r].output;
  }
}

// ddp_train's default job, short: 512 samples, one epoch, on the GPU; `batch` per rank.
std::vector<std::string> gpu_job(const std::string& out, int batch) {
  return {DDP_TRAIN_BIN,
          "--config",
          std::string(DDP_SOURCE_DIR) + "/configs/fashion_mnist_mlp.yaml",
          "--data",
          DDP_FASHION_MNIST_DIR,
          "--train-subset",
          "512",
          "--epochs",
          "1",
          "--batch-size",
          std::to_string(batch),
          "--device",
          "cuda",
          "--output-dir",
          out};
}

// 2 ranks of batch 64 under the launcher: each rank on its own GPU, nccl, and rank 0's accuracy
// line. The sampler's shards of a global batch are that batch, so one GPU with batch 128 trains
// the same model: the same losses up to float rounding (the CPU tests hold 1e-5; GPU kernels sum
// in other orders than the CPU's, and than each other at other batch sizes).
TEST(TwoGpus, LauncherTrainsOnBothGpusAsOneGpuWithTheDoubledBatch) {
  SKIP_WITHOUT_TWO_GPUS();
  TempDir two, one;
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN, "--nproc", "2"};
  const auto job = gpu_job(two.path(), 64);
  argv.insert(argv.end(), job.begin(), job.end());
  const auto launched = ddp::testing::run_process(argv, {}, seconds(240));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_NE(launched.output.find("2 rank(s), backend nccl"), std::string::npos) << launched.output;
  EXPECT_NE(launched.output.find("cuda:1"), std::string::npos) << launched.output;
  EXPECT_NE(launched.output.find("test accuracy "), std::string::npos) << launched.output;
  const auto single = ddp::testing::run_process(gpu_job(one.path(), 128), {}, seconds(240));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const auto m2 = last_metrics(two.path()), m1 = last_metrics(one.path());
  EXPECT_EQ(metrics_field(m2, "steps"), 4) << m2;  // 512 samples / (2 x 64)
  EXPECT_EQ(metrics_field(m2, "steps"), metrics_field(m1, "steps"));
  EXPECT_GT(metrics_field(m2, "test_accuracy"), 0.1) << m2;  // better than chance
  for (const char* name : {"train_loss", "test_loss"}) {
    EXPECT_NEAR(metrics_field(m2, name), metrics_field(m1, name),
                1e-4 * std::abs(metrics_field(m1, name)))
        << name << "\n"
        << m2 << "\n"
        << m1;
  }
  // A test image on the edge between two classes may flip with the rounding: 20 of 10,000.
  EXPECT_NEAR(metrics_field(m2, "test_accuracy"), metrics_field(m1, "test_accuracy"), 2e-3);
}

// --elastic on nccl: launcher --nnodes 1:1 --nproc 2 --max-restarts 1, rank 1 killed after step 5
// of 16. Rank 0 goes on alone (its communicator aborted on the launcher's notice if a collective
// waited for the dead rank), the restarted worker joins on cuda:1, is healed over a new
// communicator and holds rank 0's state bitwise; the job ends with exit 0.
TEST(TwoGpus, ElasticOnNcclALostRankIsRestartedAndJoinsWhileTheOtherGoesOn) {
  SKIP_WITHOUT_TWO_GPUS();
  TempDir out;
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN, "--nnodes", "1:1", "--nproc", "2",
                                   "--max-restarts", "1"};
  auto job = gpu_job(out.path(), 64);  // 512 samples: 4 steps an epoch at 2 x 64
  job.front() = DDP_FAULT_TRAIN_BIN;
  *(std::find(job.begin(), job.end(), "--epochs") + 1) = "4";
  job.insert(job.end(), {"--elastic", "--record-samples", "--fault", "kill", "--fault-rank", "1",
                         "--fault-after-step", "5"});
  argv.insert(argv.end(), job.begin(), job.end());
  const auto r = ddp::testing::run_process(argv, {}, seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("signal SIGKILL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[launcher] elastic: restart "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("elastic: the 2 rank(s) hold bitwise the same state"), std::string::npos)
      << r.output;
  // Every committed step recorded once, in order, through the last (the batch per rank is kept:
  // 8 steps at 1 rank for the 512 samples of an epoch, 4 at 2).
  const std::string samples = ddp::testing::read_file(out.path() + "/samples.jsonl");
  int64_t lines = 0;
  for (const char c : samples) lines += c == '\n' ? 1 : 0;
  EXPECT_GE(lines, 16) << samples;
}

// The two weights files hold the same keys, in order, and tensors equal to `tolerance` of the
// largest magnitude of each.
void expect_relatively_close_weights(const std::string& a, const std::string& b, double tolerance) {
  const auto wa = ddp::train::state_dict_from(ddp::train::read_pt_file(a), a);
  const auto wb = ddp::train::state_dict_from(ddp::train::read_pt_file(b), b);
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    const auto& ta = wa[i].second;
    const auto& tb = wb[i].second;
    ASSERT_EQ(ta.sizes(), tb.sizes()) << wa[i].first;
    const double scale = std::max(tb.abs().max().item<double>(), 1e-6);
    EXPECT_LE((ta - tb).abs().max().item<double>() / scale, tolerance) << wa[i].first;
  }
}

// mpirun -np 2 with MASTER_ADDR and MASTER_PORT for the NCCL id's exchange where ddp has no MPI
// backend (a CUDA wheel's build often has none; with one, the id goes over MPI).
ProcessResult run_mpirun_on_gpus(const std::vector<std::string>& job) {
  std::vector<std::string> argv = {DDP_MPIEXEC,
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "-np",
                                   "2",
                                   "-x",
                                   "MASTER_ADDR=127.0.0.1",
                                   "-x",
                                   "MASTER_PORT=" + std::to_string(ddp::testing::free_port())};
  argv.insert(argv.end(), job.begin(), job.end());
  return ddp::testing::run_process(argv, {}, seconds(240));
}

// The same job under mpirun (local ranks from OMPI_COMM_WORLD_LOCAL_RANK) and under the launcher
// (LOCAL_RANK): the same GPUs, the same NCCL reductions, so the same weights up to rounding.
TEST(TwoGpus, MpirunTrainsOnBothGpusAsTheLauncher) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string mpiexec = DDP_MPIEXEC;
  if (mpiexec.empty() || ::access(mpiexec.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "no mpirun: configuring found none (Open MPI's mpirun, e.g. openmpi-bin)";
  }
  TempDir launched_dir, mpi_dir;
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN, "--nproc", "2"};
  const auto job = gpu_job(launched_dir.path(), 64);
  argv.insert(argv.end(), job.begin(), job.end());
  const auto launched = ddp::testing::run_process(argv, {}, seconds(240));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  const auto mpi = run_mpirun_on_gpus(gpu_job(mpi_dir.path(), 64));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("launched by mpirun"), std::string::npos) << mpi.output;
  EXPECT_NE(mpi.output.find("2 rank(s), backend nccl"), std::string::npos) << mpi.output;
  EXPECT_NE(mpi.output.find("cuda:1"), std::string::npos) << mpi.output;
  EXPECT_NE(mpi.output.find("test accuracy "), std::string::npos) << mpi.output;
  expect_relatively_close_weights(mpi_dir.file("model.pt"), launched_dir.file("model.pt"), 1e-5);
  const auto ml = last_metrics(launched_dir.path()), mm = last_metrics(mpi_dir.path());
  EXPECT_NEAR(metrics_field(mm, "train_loss"), metrics_field(ml, "train_loss"),
              1e-5 * std::abs(metrics_field(ml, "train_loss")))
      << mm << "\n"
      << ml;
}

}  // namespace
