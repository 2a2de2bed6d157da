// Slurm for real: a throw-away one-host cluster (munged, slurmctld and slurmd, started once for the
// suite by tests/scripts/slurm_cluster.sh and always stopped) runs ddp_train under srun, where the
// rendezvous comes from Slurm's own variables (no MASTER_ADDR, no MASTER_PORT), and scancel ends
// every rank of a batch job.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>  // environ (_GNU_SOURCE)

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "built_paths.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::expect_same_weights;
using ddp::testing::launch;
using ddp::testing::mlp_args;
using ddp::testing::process_alive;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

const std::string kClusterScript = std::string(DDP_SOURCE_DIR) + "/tests/scripts/slurm_cluster.sh";

// `program` followed by `args`.
std::vector<std::string> command(std::vector<std::string> program,
                                 const std::vector<std::string>& args) {
  program.insert(program.end(), args.begin(), args.end());
  return program;
}

// The pids of the ddp_train processes whose command line names `out_dir` (unique to one test).
std::vector<int> ddp_train_pids(const std::string& out_dir) {
  std::vector<int> pids;
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  if (!proc) return pids;
  while (const dirent* entry = ::readdir(proc.get())) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::string cmdline;
    try {
      cmdline = ddp::testing::read_file("/proc/" + std::string(entry->d_name) + "/cmdline");
    } catch (const std::exception&) {
      continue;  // gone meanwhile
    }
    const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
    const bool is_ddp_train =
        argv0 == DDP_TRAIN_BIN ||
        (argv0.size() >= 10 && argv0.substr(argv0.size() - 10) == "/ddp_train");
    if (is_ddp_train && cmdline.find(std::string(1, '\0') + out_dir + '\0') != std::string::npos) {
      pids.push_back(pid);
    }
  }
  return pids;
}

// The suite's cluster: started once before its first test, stopped after its last (and, through
// the script's watchdog on this process, even when the test program is killed).
class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The rendezvous must come from Slurm: nothing of an outer launcher or job may leak into srun
    // (which passes this process's environment on to the tasks), nor an outer Slurm job's ids
    // into this cluster's clients.
    std::vector<std::string> names;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var = *e;
      const std::string name = var.substr(0, var.find('='));
      if (name.rfind("SLURM_", 0) == 0 || name.rfind("SBATCH_", 0) == 0 ||
          name.rfind("SRUN_", 0) == 0 || name == "MASTER_ADDR" || name == "MASTER_PORT" ||
          name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" ||
          name == "LOCAL_WORLD_SIZE") {
        names.push_back(name);
      }
    }
    for (const auto& name : names) ::unsetenv(name.c_str());
    dir_ = new TempDir();
    const auto r = ddp::testing::run_process(
        {"bash", kClusterScript, "start", dir_->file("cluster"), std::to_string(::getpid())}, {},
        seconds(90));
    started_ = r.exit_code == 0;
    start_output_ = r.output;
  }

  static void TearDownTestSuite() {
    const auto r = ddp::testing::run_process(
        {"bash", kClusterScript, "stop", dir_->file("cluster")}, {}, seconds(90));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(started_) << "the cluster did not start:\n" << start_output_;
  }

  // SLURM_CONF for this cluster's clients.
  static std::map<std::string, std::string> env() {
    return {{"SLURM_CONF", dir_->file("cluster") + "/slurm.conf"}};
  }

  // A Slurm client (squeue, scancel...) with a time limit.
  static ProcessResult client(const std::vector<std::string>& argv) {
    return ddp::testing::run_process(argv, env(), seconds(30));
  }

  static TempDir* dir_;
  static bool started_;
  static std::string start_output_;
};

TempDir* Slurm::dir_ = nullptr;
bool Slurm::started_ = false;
std::string Slurm::start_output_;

TEST_F(Slurm, SrunTrainsTheMlpOnTwoRanksWithoutMasterAddr) {
  ASSERT_EQ(::getenv("MASTER_ADDR"), nullptr);
  ASSERT_EQ(::getenv("MASTER_PORT"), nullptr);
  TempDir under_srun, under_launcher;
  // One thread per rank, as the launcher gives its workers when several share a node (srun leaves
  // threads to the job): LibTorch 2.6's CPU kernels add in another order with more threads.
  auto one_thread = env();
  one_thread["OMP_NUM_THREADS"] = "1";
  const auto srun =
      ddp::testing::run_process(command({"srun", "-n", "2", "--kill-on-bad-exit=1", DDP_TRAIN_BIN},
                                        mlp_args(under_srun.path(), 1)),
                                one_thread, seconds(240));
  ASSERT_EQ(srun.exit_code, 0) << srun.output;
  EXPECT_NE(srun.output.find("2 rank(s), backend shm"), std::string::npos) << srun.output;
  // Where the rendezvous came from, said by rank 0.
  EXPECT_NE(srun.output.find("from SLURM_STEP_NODELIST's first host"), std::string::npos)
      << srun.output;
  EXPECT_NE(srun.output.find("from SLURM_JOB_ID "), std::string::npos) << srun.output;

  // The same world under the launcher trains the same weights.
  const auto launched = ddp::testing::run_process(
      launch({"--nproc", "2"}, mlp_args(under_launcher.path(), 1)), {}, seconds(240));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  expect_same_weights(under_srun.file("model.pt"), under_launcher.file("model.pt"));
}

TEST_F(Slurm, ScancelEndsEveryRank) {
  TempDir job;
  const std::string out = job.file("out"), log = job.file("job.out"), script = job.file("job.sh");
  std::string line = "srun";
  for (const auto& arg : command({DDP_TRAIN_BIN}, mlp_args(out, 200))) line += " '" + arg + "'";
  ddp::testing::write_file(script, "#!/bin/bash\n" + line + "\n");
  const auto submitted = client({"sbatch", "--parsable", "-n", "2", "--output", log, script});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  // --parsable: "ID" or "ID;CLUSTER", then a newline.
  const std::string id = submitted.output.substr(0, submitted.output.find_first_of(";\n"));
  ASSERT_FALSE(id.empty()) << submitted.output;

  // Both ranks train: rank 0's first epoch is logged, and two ddp_train processes run.
  const auto deadline = Clock::now() + seconds(120);
  std::vector<int> ranks;
  std::string so_far;
  while (Clock::now() < deadline) {
    try {
      so_far = ddp::testing::read_file(log);
    } catch (const std::exception&) {
      so_far.clear();  // not written yet
    }
    ranks = ddp_train_pids(out);
    if (so_far.find("epoch 1/200") != std::string::npos && ranks.size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_NE(so_far.find("epoch 1/200"), std::string::npos) << so_far;
  ASSERT_EQ(ranks.size(), 2u) << so_far;

  const auto cancel = client({"scancel", id});
  const auto cancelled = Clock::now();
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  // Every rank gone, and the job no longer pending, running or completing.
  bool ended = false;
  std::string states;
  while (Clock::now() - cancelled < seconds(30)) {
    const bool ranks_gone = !process_alive(ranks[0]) && !process_alive(ranks[1]);
    // A job squeue has already forgotten is an error ("Invalid job id"): gone as well.
    states = client({"squeue", "-h", "-j", id, "-o", "%T"}).output;
    const bool job_done = states.find("RUNNING") == std::string::npos &&
                          states.find("PENDING") == std::string::npos &&
                          states.find("COMPLETING") == std::string::npos;
    if (ranks_gone && job_done) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto took = std::chrono::duration<double>(Clock::now() - cancelled).count();
  EXPECT_TRUE(ended) << "after " << took << " s: rank pids " << ranks[0] << " "
                     << process_alive(ranks[0]) << ", " << ranks[1] << " "
                     << process_alive(ranks[1]) << "; squeue: " << states;
  EXPECT_LE(took, 30.0);
  std::cout << "scancel ended the job's ranks in " << took << " s\n";
}

}  // namespace
