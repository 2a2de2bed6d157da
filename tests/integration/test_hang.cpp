// The hang doctor with real ranks: a rank held back before one collective (ddp_fault_train,
// tests/support/fault_train.cpp) is named by the others' stall warning, every rank exits non-zero
// at the short collective timeout, and `ddp_train --diagnose` names the rank and the collective.
// SIGUSR1 makes a rank write its flight record while it hangs. --check-params-every catches ranks
// whose parameters drift apart.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "built_paths.h"
#include "ddp/comm/diagnostics/diagnose.h"
#include "ddp/comm/diagnostics/stacks.h"
#include "ranks.h"
#include "subprocess.h"

namespace {

using ddp::testing::TempDir;
using std::chrono::seconds;

constexpr const char* kNoStacks =
    "this build has no stack traces (configured with DDP_WITH_STACKS=OFF, or without "
    "libunwind-dev and libdw-dev)";

// `fault`: ddp_fault_train's --fault options, which then runs instead of ddp_train.
std::vector<std::string> linear_job(const std::string& out, std::vector<std::string> extra = {},
                                    const std::vector<std::string>& fault = {}) {
  std::vector<std::string> argv = {fault.empty() ? DDP_TRAIN_BIN : DDP_FAULT_TRAIN_BIN, "--config",
                                   std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml",
                                   "--output-dir", out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), fault.begin(), fault.end());
  return argv;
}

TEST(Hang, ALateRankIsNamedByTheStallWarningAndTheDiagnosis) {
  TempDir out;
  // Rank 1 waits 8 s where step 3 (of 4 in the first epoch) begins its backward, before its
  // gradient all-reduce, collective #8.
  constexpr int kSeq = 8;
  const auto ranks = ddp::testing::run_env_ranks(
      2,
      linear_job(out.path(), {"--comm-timeout", "4", "--stall-warning", "1"},
                 {"--fault", "delay:8", "--fault-rank", "1", "--fault-at", "step 3: backward"}),
      seconds(90));
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& r : ranks) {
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
  // Rank 0 waited in #8 and said who had not come. The watchdog looks once a second, so on a
  // loaded machine its first warning may name a later second (any before the 4 s timeout).
  const std::regex warning("#" + std::to_string(kSeq) +
                           R"( \(backward: bucket 0\) has waited [123] s for the other ranks; )" +
                           R"(not entered by rank\(s\) 1 \(at #)" + std::to_string(kSeq - 1) +
                           R"(\))");
  EXPECT_TRUE(std::regex_search(ranks[0].output, warning)) << ranks[0].output;
  EXPECT_NE(ranks[0].output.find("flight record written to"), std::string::npos) << ranks[0].output;
  ASSERT_TRUE(std::filesystem::exists(out.file("debug/rank0.json")));
  ASSERT_TRUE(std::filesystem::exists(out.file("debug/rank1.json")));

  auto report =
      ddp::testing::run_process({DDP_TRAIN_BIN, "--diagnose", out.path()}, {}, seconds(30));
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("flight records of 2 of 2 rank(s)"), std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("diagnosis: rank(s) 1 entered collective #" + std::to_string(kSeq) +
                               " all_reduce(avg) (backward: bucket 0) only after another rank had "
                               "given up on it"),
            std::string::npos)
      << report.output;
}

// A rank that was slowing before it stalled: rank 1 computes 5 ms a step longer (its steps take
// a fraction of a millisecond otherwise), so the straggler attribution, every 4 steps, names it;
// then it waits 8 s where step 10 begins its backward. Rank 0's stall warning and the diagnosis
// both say that it was the straggler.
TEST(Hang, ARankSlowingBeforeTheStallIsNamedAsSuch) {
  TempDir out;
  const auto ranks = ddp::testing::run_env_ranks(
      2,
      linear_job(out.path(),
                 {"--epochs", "5", "--comm-timeout", "4", "--stall-warning", "1",
                  "--straggler-every", "4"},
                 {"--slow-rank", "1", "--slow-compute", "0.005", "--fault", "delay:8",
                  "--fault-rank", "1", "--fault-at", "step 10: backward"}),
      seconds(90));
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& r : ranks) EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string slowing = "straggler: rank 1 computes ";
  EXPECT_NE(ranks[0].output.find("has waited 1 s for the other ranks; not entered by rank(s) 1"),
            std::string::npos)
      << ranks[0].output;
  EXPECT_NE(ranks[0].output.find("; before it, " + slowing), std::string::npos) << ranks[0].output;
  auto report =
      ddp::testing::run_process({DDP_TRAIN_BIN, "--diagnose", out.path()}, {}, seconds(30));
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(report.output.find("rank(s) 1 entered collective"), std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("before the stall, " + slowing), std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("over steps 5-8 ("), std::string::npos) << report.output;
}

// Where a rank that never came was: rank 2 of 3, under the launcher, sleeps in a function of the
// "user's" code (tests/support/user_code.cpp, built with debug info) where step 3's backward
// begins; ranks 0 and 1 time out after 4 s in the gradients' all-reduce, #8. The launcher's report
// names rank 2's function, file and line, the collective the others waited in, and each rank's
// stacks file: rank 2's taken at the launcher's SIGUSR1, the others' just before their timeout.
TEST(Hang, TheLauncherNamesWhereASleepingRankWas) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  TempDir out;
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN, "--nproc", "3"};
  const auto job =
      linear_job(out.path(), {"--comm-timeout", "4"},
                 {"--fault", "delay:40", "--fault-rank", "2", "--fault-at", "step 3: backward"});
  argv.insert(argv.end(), job.begin(), job.end());
  const auto start = std::chrono::steady_clock::now();
  const auto r = ddp::testing::run_process(argv, {}, seconds(120));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(took, seconds(30)) << "the job waited for the sleep to end\n" << r.output;
  // The line of the sleep, as rank 2 logged it.
  std::smatch logged;
  ASSERT_TRUE(std::regex_search(r.output, logged,
                                std::regex(R"(\(in wait_in_user_code, user_code\.cpp:([0-9]+)\))")))
      << r.output;
  const std::string line = logged[1];
  EXPECT_NE(r.output.find("[launcher]       rank 2 was in user_code.cpp:" + line +
                          " (wait_in_user_code); every thread's stack: " +
                          out.file("debug/rank2.stacks.txt")),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("diagnosis: rank(s) 2 did not enter collective #8 all_reduce(avg) "
                          "(backward: bucket 0), which rank(s) 0, 1 entered"),
            std::string::npos)
      << r.output;
  for (int rank : {0, 1}) {  // in ddp's wait for the all-reduce (ddp_train has no debug info)
    EXPECT_NE(r.output.find(fmt::format("rank {} was in ddp::", rank)), std::string::npos)
        << r.output;
    const auto stacks =
        ddp::testing::read_file(out.file(fmt::format("debug/rank{}.stacks.txt", rank)));
    EXPECT_NE(stacks.find("collective #8 all_reduce(avg) about to time out"), std::string::npos)
        << stacks;
    EXPECT_NE(stacks.find("ddp::core::Reducer::finalize()"), std::string::npos) << stacks;
  }
  const auto stacks = ddp::testing::read_file(out.file("debug/rank2.stacks.txt"));
  EXPECT_NE(stacks.find("wait_in_user_code(double, int, "), std::string::npos) << stacks;
  EXPECT_NE(stacks.find("user_code.cpp:" + line + " in ddp_fault_train"), std::string::npos)
      << stacks;
}

TEST(Hang, Sigusr1WritesTheFlightRecordOfAWaitingRank) {
  TempDir out;
  // A single rank held for 6 s where the first step's forward begins, before its 3rd collective
  // (the all_gather of shapes after that forward); SIGUSR1 meanwhile.
  ddp::testing::Child child(
      linear_job(out.path(), {}, {"--fault", "delay:6", "--fault-at", "step 1: forward"}), {});
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  ASSERT_TRUE(child.wait_for_output("fault: waiting", deadline)) << child.output();
  ::kill(child.pid(), SIGUSR1);
  const auto path = out.file("debug/rank0.json");
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << child.output();
  const auto dump = ddp::comm::parse_flight_dump(ddp::testing::read_file(path), path);
  EXPECT_EQ(dump.reason, "SIGUSR1");
  EXPECT_EQ(dump.last_issued, 2u);
  EXPECT_EQ(dump.phase, "step 1: forward");  // #3: the first step's all_gather of shapes
  const auto r = child.wait_until(deadline);
  EXPECT_EQ(r.exit_code, 0) << r.output;  // the signal did not end the run
}

// The processes of `program` running with `arg` among their words (a job's output directory).
std::vector<pid_t> processes_with(const std::string& program, const std::string& arg) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ddp::testing::read_file(entry.path().string() + "/cmdline");
    std::vector<std::string> words;
    for (std::istringstream in(cmdline); in.good();) {
      std::string word;
      if (std::getline(in, word, '\0')) words.push_back(word);
    }
    if (!words.empty() && words.front() == program &&
        std::find(words.begin(), words.end(), arg) != words.end()) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

// The stacks' signals leave a healthy job healthy: SIGUSR1 five times to both ranks of a training
// job (each time every thread of the rank is interrupted to walk its stack, the backend's own
// threads and their system calls included); the job trains on and ends 0, and each rank's last
// record and stacks are there. On shared memory and gloo under the launcher, and on Open MPI under
// mpirun.
class StacksOfARunningJob : public ::testing::TestWithParam<std::string> {};

TEST_P(StacksOfARunningJob, LeaveItRunning) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  TempDir out;
  // Through shared memory a step is shorter: more of them, for the job to outlast the signals.
  const std::string epochs = GetParam() == "shm" ? "1000" : "400";
  const auto job = linear_job(out.path(), {"--epochs", epochs, "--backend", GetParam()});
  std::vector<std::string> argv = GetParam() == "mpi"
                                      ? ddp::testing::mpirun_argv(2)
                                      : std::vector<std::string>{DDP_LAUNCHER_BIN, "--nproc", "2"};
  argv.insert(argv.end(), job.begin(), job.end());
  ddp::testing::Child launcher(argv, {});
  const auto deadline = std::chrono::steady_clock::now() + seconds(120);
  ASSERT_TRUE(launcher.wait_for_output("training linear", deadline)) << launcher.output();
  const auto workers = processes_with(DDP_TRAIN_BIN, out.path());
  ASSERT_EQ(workers.size(), 2u) << launcher.output();
  for (int round = 0; round < 5; ++round) {
    for (pid_t pid : workers) ASSERT_EQ(::kill(pid, SIGUSR1), 0) << "the job ended before";
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  const auto r = launcher.wait_until(deadline);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch " + epochs + "/" + epochs), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend " + GetParam()), std::string::npos) << r.output;
  for (int rank : {0, 1}) {
    const auto path = out.file(fmt::format("debug/rank{}.json", rank));
    const auto dump = ddp::comm::parse_flight_dump(ddp::testing::read_file(path), path);
    EXPECT_EQ(dump.reason, "SIGUSR1");
    ASSERT_TRUE(dump.waiting_in.has_value()) << path;
    const auto stacks = ddp::testing::read_file(dump.waiting_in->stacks_file);
    EXPECT_NE(stacks.find("(main):\n"), std::string::npos) << stacks;
    EXPECT_NE(stacks.find(" in ddp_train\n"), std::string::npos) << stacks;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StacksOfARunningJob, ::testing::Values("shm", "gloo", "mpi"),
                         [](const auto& info) { return info.param; });

// A server that accepts connections and never answers, counting them.
class SilentServer {
 public:
  SilentServer() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
        ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      throw std::runtime_error("SilentServer: no listening socket");
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      for (int c; (c = ::accept(fd_, nullptr, nullptr)) >= 0;) {
        if (stop_) {
          ::close(c);
          break;
        }
        ++connections_;
        held_.push_back(c);  // kept open, never answered
      }
    });
  }
  ~SilentServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // ends the accept
    thread_.join();
    for (int c : held_) ::close(c);
    ::close(fd_);
  }
  int port() const { return port_; }
  int connections() const { return connections_; }

 private:
  int fd_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::vector<int> held_;
  std::thread thread_;
};

// Debian sets DEBUGINFOD_URLS in login shells; libdw's standard lookup would ask those servers
// for the debug files of every library without them (LibTorch's), while the stacks are taken.
// With the variable naming a server that never answers, a waiting rank's stacks are written within
// seconds of SIGUSR1, and the server never sees a connection.
TEST(Hang, StacksNeverAskADebuginfodServer) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  TempDir out;
  SilentServer server;
  ddp::testing::Child child(
      linear_job(out.path(), {}, {"--fault", "delay:20", "--fault-at", "step 1: forward"}),
      {{"DEBUGINFOD_URLS", fmt::format("http://127.0.0.1:{}", server.port())}});
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  ASSERT_TRUE(child.wait_for_output("fault: waiting", deadline)) << child.output();
  const auto signalled = std::chrono::steady_clock::now();
  ::kill(child.pid(), SIGUSR1);
  const auto path = out.file("debug/rank0.stacks.txt");
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << child.output();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, seconds(5));
  EXPECT_NE(ddp::testing::read_file(path).find("(main):\n"), std::string::npos);
  EXPECT_EQ(server.connections(), 0);
}

// A collective rank 1 alone issues (ddp_fault_train's extra: an all_reduce of 3 floats where step
// 3's backward begins, before the gradients' all-reduce), on 3 ranks. With --debug-collectives
// (TORCH_DISTRIBUTED_DEBUG=DETAIL) every rank ends at once, long before the 60 s comm timeout,
// with one message naming rank 1's call and the others'.
TEST(Debug, ACollectiveOneRankAloneIssuesEndsEveryRankAtOnceWithDetail) {
  TempDir out;
  const auto start = std::chrono::steady_clock::now();
  const auto ranks = ddp::testing::run_env_ranks(
      3,
      linear_job(out.path(), {"--comm-timeout", "60", "--debug-collectives"},
                 {"--fault", "extra", "--fault-rank", "1", "--fault-at", "step 3: backward"}),
      seconds(90));
  for (const auto& r : ranks) {
    EXPECT_FALSE(r.timed_out) << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(": rank 1 calls all_reduce(sum, float32[3]), ranks 0 and 2 call "
                            "all_reduce(avg, float32["),
              std::string::npos)
        << r.output;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(45));
}

// The same without DETAIL: the ranks hang or fail in the mismatched all-reduce, time out (4 s),
// and the hang doctor, from their flight records, names rank 1 and the collective.
// On gloo, rank 1 dies inside gloo (its transport thread's gloo::EnforceNotMet, uncaught: abort);
// the watchdog's terminate handler writes its flight record first.
TEST(Debug, WithoutDetailTheHangDoctorNamesTheRankThatIssuedIt) {
  TempDir out;
  const auto ranks = ddp::testing::run_env_ranks(
      3,
      linear_job(out.path(), {"--comm-timeout", "4"},
                 {"--fault", "extra", "--fault-rank", "1", "--fault-at", "step 3: backward"}),
      seconds(90));
  for (const auto& r : ranks) EXPECT_NE(r.exit_code, 0) << r.output;
  const auto report =
      ddp::testing::run_process({DDP_TRAIN_BIN, "--diagnose", out.path()}, {}, seconds(30));
  EXPECT_NE(report.output.find("ranks disagree on collective #"), std::string::npos)
      << report.output;
  EXPECT_NE(report.output.find("rank 1 all_reduce(sum) of 12 bytes"), std::string::npos)
      << report.output;
}

// --check-params-every: a rank whose parameters drift (ddp_fault_train's perturb after step 3) is
// caught at the next check, on every rank, naming the parameter; unperturbed runs pass it.
TEST(Divergence, ADriftingRankIsCaughtAtTheNextCheck) {
  TempDir healthy, drifted;
  for (const auto& r : ddp::testing::run_env_ranks(
           2, linear_job(healthy.path(), {"--epochs", "2", "--check-params-every", "1"}),
           seconds(90))) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
  }
  const auto ranks = ddp::testing::run_env_ranks(
      2,
      linear_job(drifted.path(), {"--epochs", "2", "--check-params-every", "2"},
                 {"--fault", "perturb", "--fault-rank", "1", "--fault-after-step", "3"}),
      seconds(90));
  for (const auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(
        r.output.find("parameters diverged across ranks by step 4: '0.weight' differs between "
                      "rank 0 and rank(s) 1"),
        std::string::npos)
        << r.output;
  }
}

}  // namespace
