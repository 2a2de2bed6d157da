// The launcher with real processes: training as under mpirun, fail-fast on a killed worker,
// restarts that resume from the checkpoint, two launchers as two nodes, SIGINT, any program
// (PyTorch's own DDP), and bad input.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>
#include <utility>

#include "built_paths.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"
#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::Child;
using ddp::testing::config;
using ddp::testing::expect_same_weights;
using ddp::testing::launch;
using ddp::testing::launcher_worker_pid;
using ddp::testing::metrics_field;
using ddp::testing::mlp_args;
using ddp::testing::process_alive;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

TEST(Launcher, FourWorkersTrainAsMpirunsFourRanks) {
  TempDir a, b;
  auto launched =
      ddp::testing::run_process(launch({"--nproc", "4"}, mlp_args(a.path(), 1)), {}, seconds(240));
  ASSERT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_NE(launched.output.find("[rank 0] "), std::string::npos) << launched.output;
  EXPECT_NE(launched.output.find("4 rank(s), backend shm"), std::string::npos) << launched.output;
  std::vector<std::string> under_mpirun = mlp_args(b.path(), 1);
  under_mpirun.insert(under_mpirun.begin(), DDP_TRAIN_BIN);
  under_mpirun.insert(under_mpirun.end(), {"--backend", "mpi"});  // Open MPI's own reduction
  auto mpi = ddp::testing::run_mpirun(4, under_mpirun, seconds(240));
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  const auto ma = ddp::testing::read_file(a.file("metrics.jsonl"));
  const auto mb = ddp::testing::read_file(b.file("metrics.jsonl"));
  EXPECT_EQ(metrics_field(ma, "steps"), metrics_field(mb, "steps"));
  for (const char* name : {"train_loss", "test_loss", "test_accuracy"}) {
    // Shared memory and MPI add the ranks' gradients in other orders: equal up to rounding.
    EXPECT_NEAR(metrics_field(ma, name), metrics_field(mb, name),
                1e-5 * std::abs(metrics_field(mb, name)))
        << name;
  }
}

// The names of /dev/shm that the job of rank 0's process `rank0` made (ddp-PID-...): none is left
// once its segments are mapped (Note [Nothing left in /dev/shm]).
std::vector<std::string> shm_left_by(int rank0) {
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ddp-" + std::to_string(rank0) + "-", 0) == 0) left.push_back(name);
  }
  return left;
}

// The pids of the launcher's two workers once their first epoch is done (-1 where it never was).
std::pair<int, int> workers_training(const Child& launcher) {
  if (!launcher.wait_for_output("epoch 1/200", Clock::now() + seconds(120))) {
    ADD_FAILURE() << "no epoch done:\n" << launcher.output();
    return {-1, -1};
  }
  return {launcher_worker_pid(launcher.output(), 0), launcher_worker_pid(launcher.output(), 1)};
}

TEST(Launcher, AKilledWorkerStopsTheJobWithinTenSecondsNamingRankAndSignal) {
  TempDir out;
  Child launcher(launch({"--nproc", "2"}, mlp_args(out.path(), 200)), {});
  const auto [rank0, rank1] = workers_training(launcher);
  ASSERT_GT(rank1, 0) << launcher.output();
  ::kill(rank1, SIGKILL);
  const auto killed = Clock::now();
  const ProcessResult r = launcher.wait_until(Clock::now() + seconds(30));
  EXPECT_LE(Clock::now() - killed, seconds(10));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("rank 1 (local rank 1, pid " + std::to_string(rank1) +
                          ") failed first: signal SIGKILL (9)"),
            std::string::npos)
      << r.output;
  // Rank 1 of ddp_train logs only warnings and errors: it had nothing to show.
  EXPECT_NE(r.output.find("rank 1 printed nothing"), std::string::npos) << r.output;
  EXPECT_FALSE(process_alive(rank0));
  EXPECT_FALSE(process_alive(rank1));
  EXPECT_TRUE(shm_left_by(rank0).empty());
}

// The launcher SIGKILLed mid-run: its workers end with it, and the shared memory they trained
// through leaves nothing in /dev/shm.
TEST(Launcher, AKilledLauncherTakesItsWorkersAndLeavesNothingInDevShm) {
  TempDir out;
  Child launcher(launch({"--nproc", "2"}, mlp_args(out.path(), 200)), {});
  const auto [rank0, rank1] = workers_training(launcher);
  ASSERT_GT(rank1, 0) << launcher.output();
  EXPECT_NE(launcher.output().find("2 rank(s), backend shm"), std::string::npos)
      << launcher.output();
  ASSERT_EQ(::kill(launcher.pid(), SIGKILL), 0);
  launcher.wait_until(Clock::now() + seconds(10));
  const auto deadline = Clock::now() + seconds(10);
  while ((process_alive(rank0) || process_alive(rank1)) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(process_alive(rank0));
  EXPECT_FALSE(process_alive(rank1));
  EXPECT_TRUE(shm_left_by(rank0).empty());
}

TEST(Launcher, AFailedWorkersExitCodeAndLastLinesAreReported) {
  const auto start = Clock::now();
  auto r = ddp::testing::run_process({DDP_LAUNCHER_BIN, "--nproc", "3", "/bin/sh", "-c",
                                      "for i in $(seq 1 25); do echo rank $RANK line $i; done; "
                                      "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 60"},
                                     {}, seconds(60));
  EXPECT_LE(Clock::now() - start, seconds(10));  // the sleeping ranks were stopped
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 (local rank 1, pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed first: exit code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[launcher] last 20 line(s) of rank 1:\n[launcher]   rank 1 line 6\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[launcher]   rank 1 line 25\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank 1 line 1\n"), std::string::npos) << r.output;
}

TEST(Launcher, ARestartedGroupResumesAndEndsAsAnUninterruptedRun) {
  TempDir whole, crashed;
  auto clean = ddp::testing::run_process(launch({"--nproc", "2"}, mlp_args(whole.path(), 3)), {},
                                         seconds(240));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  // 1200 samples, 2 ranks, batch 32: 19 steps per epoch; rank 1 dies after step 30 (epoch 2),
  // in the first run only (ddp_fault_train, tests/support/fault_train.cpp).
  auto args = mlp_args(crashed.path(), 3);
  args.insert(args.end(), {"--fault", "kill", "--fault-rank", "1", "--fault-after-step", "30"});
  auto r = ddp::testing::run_process(
      launch({"--nproc", "2", "--max-restarts", "1"}, args, DDP_FAULT_TRAIN_BIN), {}, seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("failed first: signal SIGKILL (9)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restarting the workers (1 of 1 restarts)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from " + crashed.file("checkpoint-epoch-0001.pt")),
            std::string::npos)
      << r.output;
  expect_same_weights(whole.file("model.pt"), crashed.file("model.pt"));
}

// Two launchers on this host as the two nodes of one job, 2 ranks each, training the Linear
// demo (120 samples a step) into `out`; `extra`: more ddp_train options. Node 0's output, after
// both ended 0.
std::string train_on_two_nodes(const TempDir& out, const std::vector<std::string>& extra = {}) {
  const std::string port = std::to_string(ddp::testing::free_port());
  const std::map<std::string, std::string> env = {{"GLOO_SOCKET_IFNAME", "lo"}};
  auto node = [&](int rank) {
    std::vector<std::string> args = {"--config",
                                     config("random_linear.yaml"),
                                     "--epochs",
                                     "2",
                                     "--global-batch-size",
                                     "120",
                                     "--output-dir",
                                     out.path()};
    args.insert(args.end(), extra.begin(), extra.end());
    return launch({"--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc", "2",
                   "--master-addr", "127.0.0.1", "--master-port", port},
                  args);
  };
  Child node0(node(0), env), node1(node(1), env);
  const auto r1 = node1.wait_until(Clock::now() + seconds(120));
  const auto r0 = node0.wait_until(Clock::now() + seconds(120));
  EXPECT_EQ(r0.exit_code, 0) << r0.output;
  EXPECT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("[launcher] rank 3: pid"), std::string::npos) << r1.output;
  return r0.output;
}

TEST(Launcher, TwoLaunchersAsTwoNodesTrainOneWorldOfFour) {
  TempDir out;
  const std::string output = train_on_two_nodes(out);
  EXPECT_NE(output.find("4 rank(s), backend gloo"), std::string::npos) << output;
  EXPECT_NE(output.find("batch 30 per rank (120 global)"), std::string::npos) << output;
}

// On two nodes of two ranks ddp_train all-reduces hierarchically by itself (--hierarchical auto:
// within each node, across nodes, within again) and trains the weights that the flat all-reduce
// (--hierarchical false) trains, to float rounding (the sums are taken in another order).
TEST(Launcher, TwoNodesOfTwoRanksAllReduceHierarchicallyToTheFlatWeights) {
  TempDir tiered, flat;
  const std::string with = train_on_two_nodes(tiered);
  EXPECT_NE(with.find("hierarchical all-reduce: 2 hosts of 2 rank(s)"), std::string::npos) << with;
  const std::string without = train_on_two_nodes(flat, {"--hierarchical", "false"});
  EXPECT_EQ(without.find("hierarchical all-reduce"), std::string::npos) << without;
  const auto a = ddp::train::state_dict_from(ddp::train::read_pt_file(tiered.file("model.pt")),
                                             tiered.file("model.pt"));
  const auto b = ddp::train::state_dict_from(ddp::train::read_pt_file(flat.file("model.pt")),
                                             flat.file("model.pt"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 1e-5, 1e-6)) << a[i].first;
  }
}

// torchrun's environment alone, as a Kubernetes operator sets it (docs/kubernetes.md).
TEST(Launcher, PetNprocPerNodeStartsThatManyWorkers) {
  TempDir out;
  auto r = ddp::testing::run_process(
      launch({}, {"--config", config("random_linear.yaml"), "--epochs", "1", "--output-dir",
                  out.path()}),
      {{"PET_NPROC_PER_NODE", "2"}}, seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[launcher] read from the environment: PET_NPROC_PER_NODE"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("launched by env: 2 rank(s)"), std::string::npos) << r.output;
}

TEST(Launcher, SigintStopsAllWorkersWithinTheGracePeriodAndExits130) {
  TempDir out;
  Child launcher(launch({"--nproc", "2", "--grace-period", "3"}, mlp_args(out.path(), 200)), {});
  ASSERT_TRUE(launcher.wait_for_output("epoch 1/200", Clock::now() + seconds(120)))
      << launcher.output();
  const int rank0 = launcher_worker_pid(launcher.output(), 0),
            rank1 = launcher_worker_pid(launcher.output(), 1);
  ::kill(launcher.pid(), SIGINT);
  const auto sent = Clock::now();
  const ProcessResult r = launcher.wait_until(Clock::now() + seconds(30));
  EXPECT_LE(Clock::now() - sent, seconds(5));
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("got SIGINT: stopping the workers"), std::string::npos) << r.output;
  EXPECT_FALSE(process_alive(rank0));
  EXPECT_FALSE(process_alive(rank1));
}

TEST(Launcher, RunsPyTorchsOwnDdpScriptUnchanged) {
  const std::vector<std::string> argv = {DDP_LAUNCHER_BIN,
                                         "--nproc",
                                         "2",
                                         DDP_PYTHON,
                                         std::string(DDP_SOURCE_DIR) + "/bench/ddp_reference.py",
                                         "--data",
                                         DDP_FASHION_MNIST_DIR,
                                         "--epochs",
                                         "1",
                                         "--train-subset",
                                         "6400"};
  auto r = ddp::testing::run_process(argv, {{"GLOO_SOCKET_IFNAME", "lo"}}, seconds(240));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] {\"epoch\": 1, \"samples_per_s\""), std::string::npos)
      << r.output;
}

// torchrun's contract under --nnodes MIN:MAX for a program that is not ddp_train --elastic (a
// user's PyTorch DDP script): it forms its own group at MASTER_ADDR:MASTER_PORT and runs as under
// torchrun's elastic agent: a failure restarts the whole group (both ranks again, restart count
// 1), and with no restart left the job ends with the failed worker's exit code.
TEST(Launcher, APyTorchScriptRunsUnderElasticAsUnderTorchrunsAgent) {
  const std::string script = std::string(DDP_SOURCE_DIR) + "/tests/python/elastic_ddp_script.py";
  auto run = [&](const std::string& restarts, bool fail) {
    std::vector<std::string> argv = {DDP_LAUNCHER_BIN, "--nnodes", "1:1",      "--nproc", "2",
                                     "--max-restarts", restarts,   DDP_PYTHON, script};
    if (fail) argv.push_back("--fail-first-run");
    return ddp::testing::run_process(argv, {{"GLOO_SOCKET_IFNAME", "lo"}}, seconds(120));
  };
  const auto weights = [](const std::string& output, int rank, int restart) {
    const std::string head = "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                             " of 2: restart " + std::to_string(restart) + ", weights ";
    const size_t at = output.find(head);
    return at == std::string::npos
               ? std::string("none")
               : output.substr(at + head.size(), output.find('\n', at) - at - head.size());
  };
  const ProcessResult plain = run("0", false);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(weights(plain.output, 0, 0), "none") << plain.output;
  EXPECT_EQ(weights(plain.output, 0, 0), weights(plain.output, 1, 0)) << plain.output;

  const ProcessResult restarted = run("1", true);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_NE(restarted.output.find("worker 1.0 (local rank 1, pid "), std::string::npos);
  EXPECT_NE(restarted.output.find(": exit code 3 (the program does not take part in elastic "
                                  "membership); every worker starts again (restart 1 of 1)"),
            std::string::npos)
      << restarted.output;
  EXPECT_EQ(weights(restarted.output, 0, 1), weights(plain.output, 0, 0)) << restarted.output;
  EXPECT_EQ(weights(restarted.output, 1, 1), weights(plain.output, 0, 0)) << restarted.output;

  const ProcessResult failed = run("0", true);
  EXPECT_EQ(failed.exit_code, 3) << failed.output;
  EXPECT_NE(failed.output.find("no restart left (--max-restarts 0)"), std::string::npos)
      << failed.output;
}

// Exit code 2 and one line "launcher: error: ..." before any worker starts.
void expect_launch_error(const std::vector<std::string>& args, const std::string& expected) {
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = ddp::testing::run_process(argv, {}, seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "launcher: error: " + expected + "\n");
}

TEST(Launcher, BadInputIsOneLineAndExitCode2) {
  expect_launch_error({"--bogus", "x"}, "unknown option '--bogus' (see launcher --help)");
  expect_launch_error({"--nproc", "0", DDP_TRAIN_BIN},
                      "--nproc: expected a positive integer, auto, cpu or gpu, got '0'");
  expect_launch_error({"--nnodes", "2", "--node-rank", "2", DDP_TRAIN_BIN},
                      "--node-rank 2 is not below --nnodes 2 (node ranks are 0 .. 1)");
  expect_launch_error({"--nproc", "2"},
                      "no program to launch (usage: launcher [options] PROGRAM [ARGS...])");
  expect_launch_error({"no-such-program-xyz"},
                      "program 'no-such-program-xyz' not found (not in PATH, or not executable)");

  // A port another process listens on.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string busy = std::to_string(ntohs(addr.sin_port));
  expect_launch_error({"--master-port", busy, DDP_TRAIN_BIN},
                      "--master-port " + busy +
                          ": cannot be used on this host (Address already in use): another job "
                          "may hold it; pick another or leave it out on one host");
  ::close(fd);
}

// A pod's DNS name resolves once the pod is ready: node 0's name is looked up again, said every
// few seconds, until --rdzv-timeout.
TEST(Launcher, AMasterNameThatNeverResolvesFailsAfterTheRdzvTimeout) {
  const auto start = Clock::now();
  auto r = ddp::testing::run_process({DDP_LAUNCHER_BIN, "--nnodes", "2", "--node-rank", "1",
                                      "--master-addr", "no-such-host.invalid", "--rdzv-timeout",
                                      "1.5", DDP_TRAIN_BIN},
                                     {}, seconds(30));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(1500));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("[launcher] --master-addr no-such-host.invalid does not resolve yet "
                          "(Name or service not known): trying again for up to 1.5 s"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("launcher: error: --master-addr no-such-host.invalid: not resolved "
                          "within 1.5 s (--rdzv-timeout): Name or service not known\n"),
            std::string::npos)
      << r.output;
}

TEST(Launcher, AMasterNobodyServesFailsAfterTheRendezvousTimeout) {
  TempDir out;
  const std::string port = std::to_string(ddp::testing::free_port());
  auto r =
      ddp::testing::run_process(launch({"--nnodes", "2", "--node-rank", "1", "--master-port", port},
                                       {"--config", config("random_linear.yaml"),
                                        "--rendezvous-timeout", "3", "--output-dir", out.path()}),
                                {}, seconds(60));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rendezvous at MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + port +
                          " did not complete within 3 s (world size 2)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("failed first"), std::string::npos) << r.output;
}

}  // namespace
