// The comm layer with real processes: gloo ranks started with the env contract, mpi ranks
// started by mpirun; closed-form collectives, timeouts, bad env. Plus the pure launch decisions.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>
#include <tuple>
#include <torch/types.h>

#include "built_paths.h"
#include "ddp/comm/launch_info.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/common/socket.h"
#include "ranks.h"
#include "scenarios.h"
#include "subprocess.h"

namespace {

using ddp::comm::detect_launch;
using ddp::comm::Env;
using ddp::comm::Launcher;
using ddp::testing::Child;
using ddp::testing::ProcessResult;
using Clock = std::chrono::steady_clock;

// The names in /dev/shm of segments that rank 0 (its "rank 0: pid N" line in `output`) created:
// "" when none is left.
std::string segments_of_rank_zero(const std::string& output) {
  std::smatch zero;
  if (!std::regex_search(output, zero, std::regex("rank 0: pid ([0-9]+)"))) {
    return "(rank 0 printed no pid)";
  }
  std::string left;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ddp-" + zero[1].str() + "-", 0) == 0) left += name + " ";
  }
  return left;
}

// Case `index`'s lines of a rank's output (comm_worker's shm-set-up-faults): from its "[case I]
// begin" line to its "[case I] rank R: exit E" line, those included; "" when it has none.
std::string case_lines(const std::string& output, size_t index) {
  const std::string tag = fmt::format("[case {}] ", index);
  const size_t begin = output.find(tag + "begin\n");
  if (begin == std::string::npos) return "";
  const size_t exit = output.find(tag + "rank ", begin);
  const size_t end = exit == std::string::npos ? std::string::npos : output.find('\n', exit);
  return output.substr(begin, end == std::string::npos ? std::string::npos : end + 1 - begin);
}

// The first child of process `pid` (/proc/PID/task/PID/children); -1 when it has none.
int child_of(int pid) {
  std::ifstream children(fmt::format("/proc/{}/task/{}/children", pid, pid));
  int child = -1;
  return children >> child ? child : -1;
}

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

bool compiled(const std::string& backend) {
  const auto all = ddp::comm::compiled_backends();
  return std::find(all.begin(), all.end(), backend) != all.end();
}

std::vector<ProcessResult> run_env_ranks(int world, const std::vector<std::string>& args,
                                         std::chrono::seconds limit,
                                         const std::map<std::string, std::string>& extra = {}) {
  std::vector<std::string> argv = {DDP_COMM_WORKER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return ddp::testing::run_env_ranks(world, argv, limit, extra);
}

ProcessResult run_mpirun(int np, const std::vector<std::string>& args, std::chrono::seconds limit) {
  std::vector<std::string> argv = {DDP_COMM_WORKER_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return ddp::testing::run_mpirun(np, argv, limit);
}

// The closed-form checks share one launch of ranks per backend and world size (support/
// scenarios.h): gloo's collectives, the shared-memory group's over it and the two against each
// other, and at 4 ranks the hierarchical all-reduce; each test asserts its own scenario's lines,
// and tests/CMakeLists.txt registers the tests of these launches as one ctest test each.
std::vector<std::string> gloo_scenarios(int world) {
  std::vector<std::string> scenarios = {"gloo", "collectives", "shm-collectives", "versus-gloo",
                                        "shm-gathers"};
  if (world < 4) scenarios.push_back("shm-buffers");
  if (world == 4) scenarios.push_back("hierarchical=a,a,b,b");
  return scenarios;
}
std::vector<std::string> mpi_scenarios(int world) {
  std::vector<std::string> scenarios = {"mpi", "collectives"};
  if (world == 4) scenarios.push_back("hierarchical=a,a,b,b");
  return scenarios;
}

const std::vector<ProcessResult>& gloo_launch(int world) {
  return ddp::testing::once_per_world(world, [](int w) {
    return run_env_ranks(w, gloo_scenarios(w), std::chrono::seconds(400));
  });
}

const ProcessResult& mpi_launch(int world) {
  return ddp::testing::once_per_world(
      world, [](int w) { return run_mpirun(w, mpi_scenarios(w), std::chrono::seconds(400)); });
}

using ddp::testing::scenario_message;

// Rank `rank` (of `world`) ended `scenario` with exit 0 after "rank r/w: N checks, 0 failures".
void expect_scenario_passes(const ProcessResult& result, const std::string& scenario, int rank,
                            int world) {
  const std::string lines = ddp::testing::scenario_lines(result.output, scenario);
  const std::string message = scenario_message(result.output, scenario);
  EXPECT_FALSE(result.timed_out) << message;
  EXPECT_NE(lines.find(fmt::format("rank {}: exit 0\n", rank)), std::string::npos) << message;
  const std::regex counts(fmt::format("rank {}/{}: [0-9]+ checks, 0 failures", rank, world));
  EXPECT_TRUE(std::regex_search(lines, counts)) << message;
}

// ---- Pure decisions: the launch matrix from env alone ----

TEST(Launch, NothingIsWorldOneLocal) {
  const auto info = detect_launch({});
  EXPECT_EQ(info.launcher, Launcher::kNone);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(ddp::comm::default_backend(info, false), "local");
  EXPECT_EQ(ddp::comm::default_backend(info, true), "nccl");
}

TEST(Launch, EnvContract) {
  const auto info = detect_launch({{"RANK", "3"},
                                   {"WORLD_SIZE", "4"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "node0"},
                                   {"MASTER_PORT", "29500"},
                                   {"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_EQ(info.launcher, Launcher::kEnv);  // the env contract wins over mpirun's variables
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(ddp::comm::default_backend(info, false), "shm");
  EXPECT_EQ(ddp::comm::default_backend(info, true), "nccl");
}

TEST(Launch, KubeflowStyleWithoutLocalRank) {
  const auto info = detect_launch(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "master-0"}, {"MASTER_PORT", "23456"}});
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
}

TEST(Launch, Mpirun) {
  const auto info = detect_launch({{"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(info.launcher, Launcher::kMpirun);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(ddp::comm::default_backend(info, false), "shm");  // every rank on this host
  EXPECT_EQ(ddp::comm::default_backend(info, true), "nccl");
  // Across hosts: mpi.
  const auto two_hosts = detect_launch({{"OMPI_COMM_WORLD_RANK", "1"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(ddp::comm::default_backend(two_hosts, false), "mpi");
  EXPECT_EQ(ddp::comm::default_backend(two_hosts, true), "nccl");
}

TEST(Launch, Slurm) {
  const auto info = detect_launch({{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "8"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                   {"MASTER_ADDR", "n1"},
                                   {"MASTER_PORT", "29500"}});
  EXPECT_EQ(info.launcher, Launcher::kSlurm);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(ddp::comm::default_backend(info, false), "shm");
}

std::string launch_error(const Env& env) {
  try {
    detect_launch(env);
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "no error";
}

// srun without MASTER_ADDR / MASTER_PORT (what a Slurm user has): PyTorch Lightning's choice, the
// step's first host and 15000 + the job id's last four digits, said in rendezvous_origin.
TEST(Launch, SlurmWithoutMasterDerivesItFromTheNodeListAndTheJobId) {
  const Env slurm = {{"SLURM_PROCID", "1"},
                     {"SLURM_NTASKS", "4"},
                     {"SLURM_JOB_ID", "1234567"},
                     {"SLURM_JOB_NODELIST", "gpu[07-09],cpu1"},
                     {"SLURM_STEP_NODELIST", "gpu[08-09]"}};
  auto info = detect_launch(slurm);
  EXPECT_EQ(info.master_addr, "gpu08");
  EXPECT_EQ(info.master_port, 19567);
  EXPECT_EQ(info.rendezvous_origin,
            "MASTER_ADDR gpu08 from SLURM_STEP_NODELIST's first host, MASTER_PORT 19567 from "
            "SLURM_JOB_ID 1234567");
  auto set = slurm;
  set["MASTER_ADDR"] = "login1";
  set["MASTER_PORT"] = "29500";
  info = detect_launch(set);
  EXPECT_EQ(info.master_addr, "login1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.rendezvous_origin, "");
  set.erase("MASTER_ADDR");
  EXPECT_EQ(detect_launch(set).rendezvous_origin,
            "MASTER_ADDR gpu08 from SLURM_STEP_NODELIST's first host");
  auto no_job = slurm;
  no_job.erase("SLURM_JOB_ID");
  EXPECT_NE(launch_error(no_job).find("MASTER_PORT is not set, and there is no SLURM_JOB_ID"),
            std::string::npos);
  auto bad_job = slurm;
  bad_job["SLURM_JOB_ID"] = "12_3";
  EXPECT_EQ(launch_error(bad_job),
            "environment variable SLURM_JOB_ID='12_3': expected a number (to derive MASTER_PORT)");
}

TEST(Launch, FirstSlurmHostOfACompressedNodeList) {
  using ddp::comm::first_slurm_host;
  EXPECT_EQ(first_slurm_host("vm"), "vm");
  EXPECT_EQ(first_slurm_host("n[01-04,07],gpu1"), "n01");
  EXPECT_EQ(first_slurm_host("n[7,3-4]"), "n7");
  EXPECT_EQ(first_slurm_host("rack[2-3]-node[05-06]"), "rack2-node05");
  EXPECT_EQ(first_slurm_host("a1,b[1-2]"), "a1");
  EXPECT_EQ(ddp::comm::slurm_port("7"), 15007);
  EXPECT_EQ(ddp::comm::slurm_port("99999"), 24999);
  EXPECT_THROW(first_slurm_host("n[01-02"), ddp::InputError);
  EXPECT_THROW(first_slurm_host(""), ddp::InputError);
}

// The address gloo binds by default on several hosts: the source of the route to MASTER_ADDR.
TEST(Launch, TheRouteToAnAddressNamesItsSourceAndInterface) {
  const auto loopback = ddp::net::route_to("127.0.0.1");
  EXPECT_EQ(loopback.source, "127.0.0.1");
  EXPECT_EQ(loopback.interface, "lo");
  EXPECT_EQ(ddp::net::route_to("no-such-host.invalid").source, "");
}

TEST(Launch, InconsistentEnvNamesTheVariable) {
  EXPECT_EQ(launch_error(
                {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
            "environment variable RANK=2 must be less than WORLD_SIZE=2");
  EXPECT_EQ(launch_error({{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
            "environment variable RANK='x': expected an integer >= 0");
  EXPECT_NE(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .find("environment variable MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(launch_error({{"RANK", "0"}}).find("environment variable WORLD_SIZE is not set"),
            std::string::npos);
  EXPECT_NE(
      launch_error(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT='70000'"),
      std::string::npos);
  EXPECT_EQ(launch_error({{"OMPI_COMM_WORLD_RANK", "0"},
                          {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
            "environment variable OMPI_COMM_WORLD_LOCAL_RANK=2 must be less than "
            "OMPI_COMM_WORLD_LOCAL_SIZE=2");
}

std::string factory_error(const std::string& backend, const Env& env, bool cuda) {
  try {
    ddp::comm::create_process_group(backend, detect_launch(env), {}, cuda);
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Factory, RefusesBackendsThatDoNotFit) {
  EXPECT_NE(factory_error("nccl", {}, false).find("backend nccl needs CUDA tensors"),
            std::string::npos);
  if (!compiled("nccl")) {
    EXPECT_NE(
        factory_error("nccl", {}, true).find("backend 'nccl' was not compiled into this build"),
        std::string::npos);
  }
  EXPECT_NE(factory_error("carrier-pigeon", {}, false).find("backend 'carrier-pigeon' is unknown"),
            std::string::npos);
  EXPECT_NE(
      factory_error(
          "local", {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
          false)
          .find("backend local runs world size 1 only"),
      std::string::npos);
  if (compiled("mpi")) {
    EXPECT_NE(factory_error("mpi", {}, false).find("backend mpi needs ranks started by mpirun"),
              std::string::npos);
  }
  if (compiled("gloo")) {
    EXPECT_NE(
        factory_error("gloo", {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, false)
            .find("backend gloo needs MASTER_ADDR and MASTER_PORT"),
        std::string::npos);
  }
  auto local = ddp::comm::create_process_group("local", detect_launch({}), {}, false);
  EXPECT_EQ(local->backend_name(), "local");
}

TEST(Factory, InitProcessGroupWithoutALauncherIsWorldOneLocal) {
  // ctest starts this process alone; under a launcher the premise would not hold.
  ASSERT_EQ(detect_launch(ddp::comm::current_env()).launcher, Launcher::kNone)
      << "run this test outside a launcher";
  std::shared_ptr<ddp::comm::ProcessGroup> group = ddp::init_process_group();
  EXPECT_EQ(group->backend_name(), "local");
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->world_size(), 1);
  auto configured = ddp::init_process_group(
      ddp::InitProcessGroupOptions().timeout(std::chrono::seconds(5)).backend("local"));
  EXPECT_EQ(configured->options().timeout, std::chrono::seconds(5));
}

// A caller's mistake in a collective's arguments is InputError on every backend (the GPU suite
// checks nccl's), not the internal-check failure it once was.
TEST(Factory, ACollectivesBadArgumentsAreTheCallersInputError) {
  auto group = ddp::comm::create_process_group("local", detect_launch({}), {}, false);
  torch::Tensor strided = torch::ones({4, 5}).t();
  EXPECT_THROW(group->all_reduce(strided), ddp::InputError);
  torch::Tensor t = torch::ones({3});
  EXPECT_THROW(group->broadcast(t, 1), ddp::InputError);
  torch::Tensor out = torch::empty({2});
  EXPECT_THROW(group->all_gather(out, t), ddp::InputError);
}

// ---- Real processes ----

class GlooRanks : public ::testing::TestWithParam<int> {};

TEST_P(GlooRanks, CollectivesMatchClosedForms) {
  if (!compiled("gloo")) GTEST_FAIL() << "gloo backend not compiled in";
  const int world = GetParam();
  const auto& results = gloo_launch(world);
  for (int r = 0; r < world; ++r) expect_scenario_passes(results[r], "collectives", r, world);
}
INSTANTIATE_TEST_SUITE_P(Worlds, GlooRanks, ::testing::Values(2, 3, 4));

// The same checks through shared memory (comm/shm) over the gloo group, its subgroups included.
TEST_P(GlooRanks, CollectivesThroughSharedMemoryMatchClosedForms) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  const int world = GetParam();
  const auto& results = gloo_launch(world);
  for (int r = 0; r < world; ++r) expect_scenario_passes(results[r], "shm-collectives", r, world);
}

// Shared memory against gloo on the same inputs, and against the rank-order sum bit for bit.
TEST_P(GlooRanks, SharedMemoryEqualsGlooAndTheRankOrderSum) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  const int world = GetParam();
  const auto& results = gloo_launch(world);
  for (int r = 0; r < world; ++r) expect_scenario_passes(results[r], "versus-gloo", r, world);
}

// The group's buffers (allocate_buffer) on shared memory: every op of a whole buffer and of views
// at odd offsets against closed forms, bit for bit the staged all-reduce of the same values,
// several buffers in flight, a buffer that outlives its group.
class ShmBuffers : public ::testing::TestWithParam<int> {};

TEST_P(ShmBuffers, AllReducedInPlaceMatchClosedFormsAndTheStagedAllReduce) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  const int world = GetParam();
  const auto& results = gloo_launch(world);
  for (int r = 0; r < world; ++r) expect_scenario_passes(results[r], "shm-buffers", r, world);
}
INSTANTIATE_TEST_SUITE_P(Worlds, ShmBuffers, ::testing::Values(2, 3));

// All-gathers into the group's buffers and reduce-scatters of them (in place: FSDP's units) on
// the group and on a subgroup of every rank: closed forms at odd sizes and past a slot, from a
// plain shard and from the rank's own block, into a plain tensor and into its own block, bit for
// bit the staged ones of the same values; and where only rank 0's memory is in a buffer.
TEST_P(GlooRanks, GathersIntoAndScattersOfTheGroupsBuffersMatchClosedFormsAndTheStagedOnes) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  const int world = GetParam();
  const auto& results = gloo_launch(world);
  for (int r = 0; r < world; ++r) expect_scenario_passes(results[r], "shm-gathers", r, world);
}

// The same checks on the world-size-1 backend (subgroups of the one rank).
TEST(Local, CollectivesMatchClosedForms) {
  auto results = run_env_ranks(1, {"local", "collectives"}, std::chrono::seconds(120));
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  expect_scenario_passes(results[0], "collectives", 0, 1);
}

TEST(Gloo, RankThatNeverJoinsTimesOutTheOthers) {
  const auto start = Clock::now();
  auto results = run_env_ranks(3, {"gloo", "skip", "3000"}, std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].output;
    EXPECT_NE(results[r].output.find(
                  fmt::format("rank {}: all_reduce(sum) #2 (1000 elements of float32) "
                              "timed out after 3 s on backend gloo: expected ranks 0-2",
                              r)),
              std::string::npos)
        << results[r].output;
  }
  EXPECT_NE(results[2].output.find("rank 2: not joining all_reduce #2"), std::string::npos);
  // The sleeper sleeps 3 timeouts (9 s); the others must have ended long before the 60 s limit.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

// A rank killed inside a collective through shared memory: the others end within a second,
// well before the 60 s timeout, naming it; the segments were unlinked long before. `scenario`
// all-reduces a plain tensor or a buffer of the group, or all-gathers into a buffer (collective
// `numbered`, #2, the last), which the others name as done in place.
void expect_a_killed_rank_named(const std::string& scenario, const std::string& numbered,
                                const std::string& call) {
  const auto start = Clock::now();
  auto results = run_env_ranks(3, {"shm", scenario, "60000"}, std::chrono::seconds(60));
  EXPECT_EQ(results[2].exit_code, 128 + SIGKILL) << results[2].output;
  std::smatch pid;
  ASSERT_TRUE(std::regex_search(results[2].output, pid, std::regex("rank 2: pid ([0-9]+)")))
      << results[2].output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].output;
    EXPECT_NE(results[r].output.find(fmt::format(
                  "rank {}: {} failed on backend shm: rank 2 (process {}) ended during {}", r,
                  numbered, pid[1].str(), call)),
              std::string::npos)
        << results[r].output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(segments_of_rank_zero(results[0].output), "");
}

TEST(Shm, ARankKilledInAnAllReduceIsNamedAtOnceAndLeavesNothingInDevShm) {
  expect_a_killed_rank_named("die-in-all-reduce", "all_reduce(sum) #2", "all_reduce");
}

TEST(Shm, ARankKilledInAnAllReduceOfABufferIsNamedAtOnceAndLeavesNothingInDevShm) {
  expect_a_killed_rank_named("die-in-buffer-all-reduce", "all_reduce(sum) #2",
                             "all_reduce(sum, float32[1000]) in place at byte 0 of buffer 0");
}

TEST(Shm, ARankKilledInAnAllGatherIntoABufferIsNamedAtOnceAndLeavesNothingInDevShm) {
  expect_a_killed_rank_named("die-in-buffer-all-gather", "all_gather #2",
                             "all_gather(4000 bytes) in place at byte 0 of buffer 0");
}

// Rank 0 all-reduces a buffer of the group, rank 1 a plain tensor of its size: both fail at once,
// naming both calls, rank 0's in place (the path a buffer takes).
TEST(Shm, ABufferAllReducedAgainstAPlainTensorNamesBothCalls) {
  const auto start = Clock::now();
  auto results = run_env_ranks(2, {"shm", "buffer-mismatch", "60000"}, std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].output;
    EXPECT_NE(results[r].output.find(fmt::format(
                  "rank {}: all_reduce(sum) #1 failed on backend shm: "
                  "ranks disagree: rank 1 calls all_reduce(sum, float32[1000]), rank 0 calls "
                  "all_reduce(sum, float32[1000]) in place at byte 0 of buffer 0",
                  r)),
              std::string::npos)
        << results[r].output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

// A rank in its own PID namespace (a container that shares /dev/shm with the others, not its
// pids), stopped for 2 s and resumed, then killed: the pause is not taken for its death, and the
// death is named within seconds, not at the 60 s timeout.
TEST(Shm, ARankInItsOwnPidNamespaceIsNamedWhenKilledNotWhenPaused) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  ASSERT_EQ(ddp::testing::run_process({"unshare", "-pf", "--mount-proc", "true"}).exit_code, 0)
      << "needs root and unshare -p (CAP_SYS_ADMIN), as CI has; a container build step has not "
         "(docker/Dockerfile.cpu leaves this test out)";
  const std::vector<std::string> args = {DDP_COMM_WORKER_BIN, "shm", "all-reduce-until-error",
                                         "60000"};
  auto env = [port = ddp::testing::free_port()](int rank) {
    return std::map<std::string, std::string>{
        {"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", "2"},           {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "127.0.0.1"},  {"MASTER_PORT", std::to_string(port)}};
  };
  Child zero(args, env(0));
  std::vector<std::string> in_namespace = {"unshare", "-pf", "--mount-proc"};
  in_namespace.insert(in_namespace.end(), args.begin(), args.end());
  Child one(in_namespace, env(1));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  ASSERT_TRUE(one.wait_for_output("rank 1: 1 all_reduces", deadline)) << one.output();
  ASSERT_NE(one.output().find("rank 1: pid 1,"), std::string::npos) << one.output();
  const int worker = child_of(one.pid());
  ASSERT_GT(worker, 0) << "no process under unshare (pid " << one.pid() << ")";

  ::kill(worker, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ::kill(worker, SIGCONT);
  const int seen = count_of(zero.output(), " all_reduces\n");
  const auto resumed = Clock::now() + std::chrono::seconds(3);
  while (count_of(zero.output(), " all_reduces\n") < seen + 2 && Clock::now() < resumed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(count_of(zero.output(), " all_reduces\n"), seen + 2)
      << "rank 0 did not go on after rank 1 resumed:\n" << zero.output();

  ::kill(worker, SIGKILL);
  const auto killed = Clock::now();
  const ProcessResult r = zero.wait_until(killed + std::chrono::seconds(30));
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(5)) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed on backend shm: rank 1 (process 1) ended during all_reduce"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(segments_of_rank_zero(r.output), "");
}

// The set-up of the shared-memory group, then of a buffer of it (allocate_buffer), fails on a rank
// at each of their collectives over gloo (it dies there, or throws), or the rank dies once the
// buffer is made: every rank ends, and the segments' names are gone from /dev/shm (Note [Nothing
// left in /dev/shm]). One launch of 2 ranks for the 28 cases: each case's ranks are processes
// that the workers fork for it, with a group of their own (comm_worker's shm-set-up-faults).
TEST(Shm, ASetUpThatFailsAnywhereLeavesNothingInDevShm) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  // The group's: all_gather_bytes (the segment's name), any_rank, all_gather_bytes; the
  // buffer's the same.
  constexpr int kGroupSetUp = 5;
  constexpr int kSetUpCollectives = 2 * kGroupSetUp;
  std::vector<std::tuple<int, int, std::string>> faults;
  for (int k = 1; k <= kSetUpCollectives + 1; ++k) {
    for (int rank : {0, 1}) faults.emplace_back(rank, k, "kill");
  }
  // Throws where a rank's own step can fail: from the first any_rank of each set-up on.
  for (int k : {3, 4, 5, kGroupSetUp + 3, kGroupSetUp + 4, kGroupSetUp + 5}) {
    faults.emplace_back(0, k, "fail");
  }
  std::vector<std::string> cases;
  for (const auto& [rank, k, mode] : faults) {
    cases.push_back(fmt::format("{}:{}:{}", rank, k, mode));
  }
  ddp::testing::TempDir ports;
  const auto results = run_env_ranks(
      2, {"gloo", "shm-set-up-faults", ports.path(), fmt::format("{}", fmt::join(cases, ","))},
      std::chrono::seconds(300));
  for (size_t i = 0; i < faults.size(); ++i) {
    const auto& [rank, k, mode] = faults[i];
    const std::string what = fmt::format("case {}: rank {} ({}) at set-up collective {}", i, rank,
                                         mode, k);
    const int other = 1 - rank;
    const std::string mine = case_lines(results[static_cast<size_t>(rank)].output, i);
    const std::string theirs = case_lines(results[static_cast<size_t>(other)].output, i);
    EXPECT_NE(mine.find(fmt::format("rank {}: exit {}\n", rank,
                                    mode == "kill" ? 128 + SIGKILL : 1)),
              std::string::npos)
        << what << "\n" << mine;
    EXPECT_NE(theirs.find(fmt::format("rank {}: exit 1\n", other)), std::string::npos)
        << what << "\n" << theirs;
    // A rank that dies at the first collective may leave before the other's side of the gloo
    // group's connection is done: then that group's creation is where the other's set-up ends.
    EXPECT_TRUE(theirs.find(fmt::format("rank {}: set-up ended: ", other)) != std::string::npos ||
                (k == 1 && theirs.find("gloo could not connect") != std::string::npos))
        << what << "\n" << theirs;
    EXPECT_EQ(segments_of_rank_zero(case_lines(results[0].output, i)), "") << what;
  }
  for (const auto& r : results) EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A buffer that /dev/shm cannot hold: 2 ranks in a mount namespace whose /dev/shm is a tmpfs of
// 40 MB, where the channel's segment (about 24 MB) fits and a buffer of 16 MB a rank (32 MB)
// does not. Rank 0 names the fallback, and the buffer, ordinary memory, all-reduces right.
TEST(Shm, ABufferThatDoesNotFitInDevShmIsOrdinaryMemoryAndStillReduces) {
  if (!compiled("shm")) GTEST_FAIL() << "shm backend not compiled in";
  constexpr int64_t kNumel = int64_t{4} << 20;  // float32: 16 MiB a rank
  const std::string small_dev_shm =
      "mount -t tmpfs -o size=40m tmpfs /dev/shm || exit 125; exec \"$0\" \"$@\"";
  const auto r =
      ddp::testing::run_process({"unshare", "--mount", "--propagation", "private", "sh", "-c",
                                 small_dev_shm, DDP_LAUNCHER_BIN, "--nproc", "2",
                                 DDP_COMM_WORKER_BIN, "gloo", fmt::format("shm-buffer={}", kNumel)},
                                {}, std::chrono::seconds(120));
  ASSERT_NE(r.exit_code, 125)
      << "needs root and unshare --mount (CAP_SYS_ADMIN), as CI has; a container build step has "
         "not (docker/Dockerfile.cpu leaves this test out):\n"
      << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("the buffer of {} bytes a rank is ordinary memory, its "
                                      "all-reduces staged",
                                      kNumel * 4)),
            std::string::npos)
      << r.output;
  const std::string lines = ddp::testing::scenario_lines(r.output, "shm-buffer");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(lines.find(fmt::format("rank {}: the buffer is ordinary memory", rank)),
              std::string::npos)
        << r.output;
    EXPECT_TRUE(std::regex_search(
        lines, std::regex(fmt::format("rank {}/2: [0-9]+ checks, 0 failures", rank))))
        << r.output;
  }
  EXPECT_EQ(count_of(r.output, "shared memory: rank "), 1) << r.output;  // not the channel's
}

// The same through shared memory: the message every backend gives, and which rank did not come.
TEST(Shm, RankThatNeverJoinsTimesOutTheOthersNamingIt) {
  const auto start = Clock::now();
  auto results = run_env_ranks(3, {"shm", "skip", "3000"}, std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].output;
    const std::string timeout = fmt::format(
        "rank {}: all_reduce(sum) #2 (1000 elements of float32) timed out after 3 s on backend "
        "shm: expected ranks 0-2",
        r);
    EXPECT_NE(results[r].output.find(timeout), std::string::npos) << results[r].output;
    EXPECT_NE(results[r].output.find("(rank 2 did not arrive at all_reduce(sum, float32[1000]) within 3 s"),
              std::string::npos)
        << results[r].output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

TEST(Gloo, BadEnvFailsEveryRankFast) {
  const auto start = Clock::now();
  auto results =
      run_env_ranks(2, {"gloo", "setup"}, std::chrono::seconds(20), {{"WORLD_SIZE", "1"}});
  // RANK=1 with WORLD_SIZE=1 on rank 1; rank 0 is consistent (world 1) and succeeds alone.
  EXPECT_EQ(results[1].exit_code, 2) << results[1].output;
  EXPECT_NE(results[1].output.find("environment variable RANK=1 must be less than WORLD_SIZE=1"),
            std::string::npos);
  auto missing =
      run_env_ranks(2, {"gloo", "setup"}, std::chrono::seconds(20), {{"MASTER_PORT", "abc"}});
  for (const auto& r : missing) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("environment variable MASTER_PORT='abc'"), std::string::npos)
        << r.output;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
}

TEST(Gloo, PortInUseIsNamedByRankZero) {
  // Hold the port with a listening socket of our own.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto start = Clock::now();
  Child rank0({DDP_COMM_WORKER_BIN, "gloo", "setup"}, {{"RANK", "0"},
                                                       {"WORLD_SIZE", "2"},
                                                       {"MASTER_ADDR", "127.0.0.1"},
                                                       {"MASTER_PORT", std::to_string(port)}});
  auto r = rank0.wait_until(Clock::now() + std::chrono::seconds(20));
  close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(fmt::format("MASTER_PORT {} is already in use", port)), std::string::npos)
      << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

// mpirun's ranks print into one output: each rank's lines of the scenario are in it.
void expect_mpi_collectives_pass(int world) {
  if (!compiled("mpi")) GTEST_FAIL() << "mpi backend not compiled in";
  const ProcessResult& r = mpi_launch(world);
  for (int rank = 0; rank < world; ++rank) expect_scenario_passes(r, "collectives", rank, world);
  EXPECT_EQ(scenario_message(r.output, "collectives").find("MISMATCH"), std::string::npos)
      << scenario_message(r.output, "collectives");
}

TEST(Mpi, CollectivesMatchClosedFormsWithTwoRanks) { expect_mpi_collectives_pass(2); }

// An odd world, as gloo has: uneven subgroups (ranks {0, 2} and {1}).
TEST(Mpi, CollectivesMatchClosedFormsWithThreeRanksOversubscribed) {
  expect_mpi_collectives_pass(3);
}

TEST(Mpi, CollectivesMatchClosedFormsWithFourRanksOversubscribed) {
  expect_mpi_collectives_pass(4);
}

TEST(Mpi, RankThatNeverJoinsTimesOutTheOthers) {
  const auto start = Clock::now();
  auto r = run_mpirun(2, {"mpi", "skip", "3000"}, std::chrono::seconds(60));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("rank 0: all_reduce(sum) #2 (1000 elements of float32) timed out after 3 s on "
                    "backend mpi: expected ranks 0-1"),
      std::string::npos)
      << r.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
}

}  // namespace

namespace {

// TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 1's 5th collective is another op, dtype or shape, or it
// skips the 5th; every rank ends at once (each measures from its first collective to the error,
// the comm timeout being 60 s) with one message naming both calls and the collective's number.
struct DetailCase {
  std::string backend;
  int world;
};
void PrintTo(const DetailCase& c, std::ostream* os) {
  *os << c.backend << " at " << c.world;
}

class DetailNamesTheMismatch : public ::testing::TestWithParam<DetailCase> {};

// Rank 1's call for each kind, and the message at `world` ranks: the smaller group of ranks
// first, ties by their lowest rank.
std::string expected_message(const std::string& kind, int world, int seq) {
  const std::string theirs = "all_reduce(sum, float32[10])";
  const std::string mine = kind == "op"      ? "broadcast(float32[12]) from rank 0"
                           : kind == "dtype" ? "all_reduce(sum, float64[10])"
                           : kind == "shape" ? "all_reduce(sum, float32[12])"
                                             : "broadcast(float32[10]) from rank 0";  // skip
  if (world == 2) {
    return fmt::format("collective #{}: rank 0 calls {}, rank 1 calls {}", seq, theirs, mine);
  }
  return fmt::format("collective #{}: rank 1 calls {}, ranks 0 and 2 call {}", seq, mine, theirs);
}

// The four kinds run one after the other in one job (the worker goes on after each failure): each
// makes 4 collectives, then fails at the check of its 5th, so the k-th kind (from 0) names
// collective #5 + 5k.
TEST_P(DetailNamesTheMismatch, EveryRankEndsAtOnceNamingBothCalls) {
  const auto& c = GetParam();
  if (!compiled(c.backend)) GTEST_SKIP() << "backend " << c.backend << " not compiled in";
  const std::vector<std::string> kinds = {"op", "dtype", "shape", "skip"};
  std::vector<std::string> args = {c.backend, "mismatch", "60000"};
  args.insert(args.end(), kinds.begin(), kinds.end());
  std::string output;
  if (c.backend == "mpi") {
    std::vector<std::string> argv = {"-x", "TORCH_DISTRIBUTED_DEBUG=DETAIL", DDP_COMM_WORKER_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = ddp::testing::run_mpirun(c.world, argv, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    output = r.output;
  } else {
    for (const auto& r : run_env_ranks(c.world, args, std::chrono::seconds(60),
                                       {{"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}})) {
      EXPECT_EQ(r.exit_code, 0) << r.output;
      output += r.output;
    }
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    SCOPED_TRACE(kinds[k]);
    const std::string message = expected_message(kinds[k], c.world, 5 + 5 * static_cast<int>(k));
    for (int rank = 0; rank < c.world; ++rank) {
      const std::string failed = fmt::format("rank {}: {}: failed after ", rank, kinds[k]);
      const auto at = output.find(failed);
      ASSERT_NE(at, std::string::npos) << output;
      EXPECT_LT(std::stod(output.substr(at + failed.size())), 5.0) << output;
    }
    EXPECT_EQ(count_of(output, message), c.world) << "want: " << message << "\n" << output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DetailNamesTheMismatch,
                         ::testing::Values(DetailCase{"gloo", 2}, DetailCase{"gloo", 3},
                                           DetailCase{"mpi", 2}, DetailCase{"mpi", 3}),
                         [](const ::testing::TestParamInfo<DetailCase>& info) {
                           return info.param.backend + "_world" + std::to_string(info.param.world);
                         });

// Hierarchical all-reduce (comm/hierarchical.h) against the flat one on the same ranks: exact for
// integer values (float32 and int64), to 1e-12 for random doubles; every op; sizes that the
// host's ranks do not divide; several in flight. Layouts: 2 hosts of 2 ranks in order, and 3
// hosts of 2 whose ranks interleave (a,b,c,a,b,c), on gloo; 2 hosts of 2 on mpi.
struct HierarchyCase {
  std::string backend;
  std::string hosts;
};

// Printed in the test's registered name: gtest prints a struct without one as its bytes, pointers
// included, so the name changed with every build and ctest never found its cost data.
void PrintTo(const HierarchyCase& c, std::ostream* os) {
  *os << c.backend << " on hosts " << c.hosts;
}

class HierarchicalAllReduce : public ::testing::TestWithParam<HierarchyCase> {};

// At 4 ranks on 2 hosts, the scenario of the 4-rank launch of the closed-form checks; the 6-rank
// layout, a launch of its own.
TEST_P(HierarchicalAllReduce, EqualsTheFlatOne) {
  const auto& c = GetParam();
  if (!compiled(c.backend)) GTEST_SKIP() << "backend " << c.backend << " not compiled in";
  const int world = static_cast<int>(std::count(c.hosts.begin(), c.hosts.end(), ',')) + 1;
  if (c.backend == "mpi") {
    ASSERT_EQ(c.hosts, "a,a,b,b");  // the 4-rank launch's layout
    for (int rank = 0; rank < world; ++rank) {
      expect_scenario_passes(mpi_launch(world), "hierarchical", rank, world);
    }
    return;
  }
  const std::vector<ProcessResult> own =
      c.hosts == "a,a,b,b" ? std::vector<ProcessResult>{}
                           : run_env_ranks(world, {c.backend, "hierarchical=" + c.hosts},
                                           std::chrono::seconds(120));
  const auto& results = c.hosts == "a,a,b,b" ? gloo_launch(world) : own;
  for (int rank = 0; rank < world; ++rank) {
    expect_scenario_passes(results[rank], "hierarchical", rank, world);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalAllReduce,
    ::testing::Values(HierarchyCase{"gloo", "a,a,b,b"}, HierarchyCase{"gloo", "a,b,c,a,b,c"},
                      HierarchyCase{"mpi", "a,a,b,b"}),
    [](const ::testing::TestParamInfo<HierarchyCase>& info) {
      const auto& p = info.param;
      return p.backend + "_" + std::to_string(std::count(p.hosts.begin(), p.hosts.end(), ',') + 1) +
             "ranks" + (p.hosts == "a,b,c,a,b,c" ? "_interleaved" : "");
    });

}  // namespace
