// The launcher's decisions without processes: options and env variables, torchrun's worker
// environment, how a worker's end is described.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <fstream>

#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/common/error.h"
#include "ddp/common/fork_server.h"
#include "options.h"

namespace {

using ddp::InputError;
using ddp::launch::LaunchOptions;
using ddp::launch::parse_launch_args;
using Env = std::map<std::string, std::string>;

LaunchOptions parse(const std::vector<std::string>& args, const Env& env = {}, int gpus = 0) {
  return parse_launch_args(args, env, gpus);
}

std::string error_of(const std::vector<std::string>& args, const Env& env = {}) {
  try {
    parse(args, env);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError";
  return "";
}

TEST(LaunchOptions, OptionsEndAtTheProgramWhoseArgumentsArePassedOn) {
  const auto o = parse({"--nproc", "4", "--max-restarts=2", "--tee", "--log-dir", "logs",
                        "ddp_train", "--config", "x.yaml", "--nproc", "9"});
  EXPECT_EQ(o.nproc, 4);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_TRUE(o.tee);
  EXPECT_EQ(o.log_dir, "logs");
  EXPECT_EQ(o.program,
            (std::vector<std::string>{"ddp_train", "--config", "x.yaml", "--nproc", "9"}));
  EXPECT_EQ(parse({"--", "--odd-program"}).program, std::vector<std::string>{"--odd-program"});
  // Defaults.
  const auto d = parse({"prog"});
  EXPECT_EQ(d.nproc, 1);
  EXPECT_EQ(d.nnodes, 1);
  EXPECT_EQ(d.master_addr, "127.0.0.1");
  EXPECT_EQ(d.master_port, 0);
  EXPECT_EQ(d.run_id, "none");
}

// ddp_train's rule for flags: alone, spaced and with "=" (every flag of the table: --tee, --help);
// only a bool word is taken, so the next option or the program is never swallowed.
TEST(LaunchOptions, AFlagTakesTheFlagTheSpacedAndTheEqualsForm) {
  using Words = std::vector<std::string>;
  const std::vector<std::pair<Words, bool>> cases = {
      {{"--tee"}, true},        {{"--tee", "false"}, false}, {{"--tee", "true"}, true},
      {{"--tee", "0"}, false},  {{"--tee", "1"}, true},      {{"--tee", "no"}, false},
      {{"--tee", "yes"}, true}, {{"--tee", "off"}, false},   {{"--tee", "on"}, true},
      {{"--tee=false"}, false}, {{"--tee=1"}, true}};
  for (const auto& [flag, expected] : cases) {
    Words args = flag;
    args.insert(args.end(), {"--log-dir", "logs", "prog", "--x"});
    const auto o = parse(args);
    EXPECT_EQ(o.tee, expected) << args[0] << " " << args[1];
    EXPECT_EQ(o.log_dir, "logs");
    EXPECT_EQ(o.program, (Words{"prog", "--x"}));
  }
  // The program right after a flag stays the program; one named like a bool goes after "--".
  EXPECT_EQ(parse({"--tee", "ddp_train", "false"}).program, (Words{"ddp_train", "false"}));
  EXPECT_TRUE(parse({"--tee", "ddp_train"}).tee);
  const auto escaped = parse({"--tee", "--", "true"});
  EXPECT_TRUE(escaped.tee);
  EXPECT_EQ(escaped.program, Words{"true"});
  EXPECT_EQ(parse({"--tee", "false", "true"}).program, Words{"true"});
  EXPECT_FALSE(parse({"--help", "false", "prog"}).help);
  EXPECT_TRUE(parse({"--help", "prog"}).help);
  EXPECT_EQ(error_of({"--tee=maybe", "prog"}), "--tee: expected true or false, got 'maybe'");
}

// The bool words are ddp_train's (ddp/common/bool_words.h): in any case.
TEST(LaunchOptions, AFlagReadsBoolWordsInAnyCase) {
  using Words = std::vector<std::string>;
  EXPECT_FALSE(parse({"--tee", "FALSE", "prog"}).tee);
  EXPECT_EQ(parse({"--tee", "Off", "prog"}).program, Words{"prog"});
  EXPECT_TRUE(parse({"--tee=YES", "prog"}).tee);
  EXPECT_FALSE(parse({"prog"}, {{"DDP_LAUNCH_TEE", "No"}}).tee);
  EXPECT_EQ(error_of({"prog"}, {{"DDP_LAUNCH_TEE", "maybe"}}),
            "DDP_LAUNCH_TEE: expected true or false, got 'maybe'");
}

// Words after the options are the program's, and an option's value is its own, whatever they
// look like.
TEST(LaunchOptions, ValuesAndTheProgramsWordsAreNeverReadAsOptions) {
  using Words = std::vector<std::string>;
  const auto o = parse({"--run-id", "--tee", "prog", "--tee", "false", "--", "--nproc=3"});
  EXPECT_EQ(o.run_id, "--tee");
  EXPECT_FALSE(o.tee);
  EXPECT_EQ(o.nproc, 1);
  EXPECT_EQ(o.program, (Words{"prog", "--tee", "false", "--", "--nproc=3"}));
  EXPECT_EQ(parse({"--log-dir=", "prog"}).log_dir, "");
  EXPECT_EQ(parse({"--tee=false", "--", "--", "x"}).program, (Words{"--", "x"}));
}

// As given: the last of repeated options wins, --nproc and its alias alike, and an error names the
// spelling given; the first bad word on the line is the one reported.
TEST(LaunchOptions, OptionsApplyInOrderAndTheFirstBadOneIsReported) {
  EXPECT_EQ(parse({"--nproc", "3", "--nproc-per-node", "2", "prog"}).nproc, 2);
  EXPECT_EQ(parse({"--nproc-per-node", "3", "--nproc=1", "prog"}).nproc, 1);
  EXPECT_TRUE(parse({"--tee=false", "--tee", "prog"}).tee);
  EXPECT_EQ(parse({"--run-id", "a", "--run-id", "b", "prog"}).run_id, "b");
  EXPECT_EQ(error_of({"--nproc-per-node=x", "prog"}),
            "--nproc-per-node: expected a positive integer, auto, cpu or gpu, got 'x'");
  EXPECT_EQ(error_of({"--nproc", "0", "--bogus", "prog"}),
            "--nproc: expected a positive integer, auto, cpu or gpu, got '0'");
  EXPECT_EQ(error_of({"--nproc", "0", "--log-dir"}),
            "--nproc: expected a positive integer, auto, cpu or gpu, got '0'");
  EXPECT_EQ(error_of({"--bogus", "--nproc", "0", "prog"}),
            "unknown option '--bogus' (see launcher --help)");
  EXPECT_EQ(error_of({"--nproc", "2", "--log-dir"}), "--log-dir: expected DIR after it");
}

TEST(LaunchOptions, EnvVariablesSetOptionsAndTheCommandLineWins) {
  const Env env = {
      {"DDP_LAUNCH_NPROC_PER_NODE", "3"}, {"DDP_LAUNCH_RUN_ID", "job7"}, {"DDP_LAUNCH_TEE", "1"}};
  auto o = parse({"prog"}, env);
  EXPECT_EQ(o.nproc, 3);
  EXPECT_EQ(o.run_id, "job7");
  EXPECT_TRUE(o.tee);
  EXPECT_EQ(parse({"--nproc-per-node", "2", "prog"}, env).nproc, 2);
  EXPECT_EQ(error_of({"prog"}, {{"DDP_LAUNCH_NPROCS", "2"}}),
            "DDP_LAUNCH_NPROCS: no launcher option --nprocs (see launcher --help)");
  EXPECT_EQ(error_of({"prog"}, {{"DDP_LAUNCH_NNODES", "x"}}),
            "DDP_LAUNCH_NNODES: expected a positive integer, got 'x'");
}

// Kubeflow's PyTorchJob sets torchrun's PET_* variables beside MASTER_ADDR, MASTER_PORT,
// WORLD_SIZE (every process of the job) and RANK (the pod's index): PET_* describe the job.
TEST(LaunchOptions, TorchrunsPetVariablesSetOptionsUnderOursAndTheCommandLine) {
  const Env pod = {{"PET_NNODES", "2"},           {"PET_NPROC_PER_NODE", "2"},
                   {"PET_NODE_RANK", "1"},        {"PET_MASTER_ADDR", "job-master-0"},
                   {"PET_MASTER_PORT", "23456"},  {"MASTER_ADDR", "job-master-0"},
                   {"MASTER_PORT", "23456"},      {"WORLD_SIZE", "4"},
                   {"RANK", "1"},                 {"PET_RDZV_CONF", "join_timeout=60"}};
  auto o = parse({"prog"}, pod);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.nproc, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "job-master-0");
  EXPECT_EQ(o.master_port, 23456);
  EXPECT_EQ(o.given_local_rank, -1);  // RANK and WORLD_SIZE were not read
  EXPECT_EQ(o.ignored_env, std::vector<std::string>{"PET_RDZV_CONF"});
  EXPECT_EQ(o.read_from, (std::vector<std::string>{"PET_MASTER_ADDR", "PET_MASTER_PORT",
                                                   "PET_NNODES", "PET_NODE_RANK",
                                                   "PET_NPROC_PER_NODE"}));
  const auto env = ddp::launch::worker_env(o, 1, 23456, 0, {});
  EXPECT_EQ(env.at("RANK"), "3");
  EXPECT_EQ(env.at("WORLD_SIZE"), "4");
  // Which wins: the command line, then DDP_LAUNCH_*, then PET_*.
  Env both = pod;
  both["DDP_LAUNCH_NPROC"] = "3";
  EXPECT_EQ(parse({"prog"}, both).nproc, 3);
  EXPECT_EQ(parse({"--nproc_per_node=1", "prog"}, both).nproc, 1);
  EXPECT_EQ(error_of({"prog"}, {{"PET_NNODES", "two"}}),
            "PET_NNODES: expected a positive integer, got 'two'");
  // Elastic, as the operator sets it with an elasticPolicy.
  o = parse({"prog"}, {{"PET_NNODES", "1:3"}, {"PET_RDZV_ENDPOINT", "job-worker-0:29400"},
                       {"PET_RDZV_ID", "j1"}, {"PET_MAX_RESTARTS", "2"}});
  EXPECT_TRUE(o.elastic);
  EXPECT_EQ(o.min_nnodes, 1);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.master_addr, "job-worker-0");
  EXPECT_EQ(o.master_port, 29400);
  EXPECT_EQ(o.run_id, "j1");
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(parse({"--rdzv-endpoint", "[::1]:5", "prog"}).master_addr, "::1");
  EXPECT_EQ(parse({"--rdzv-endpoint", "[::1]:5", "prog"}).master_port, 5);
  EXPECT_EQ(parse({"--rdzv-endpoint", "fe80::1", "prog"}).master_addr, "fe80::1");
  EXPECT_EQ(parse({"--rdzv_endpoint", "h", "prog"}).master_port, 0);
  EXPECT_EQ(error_of({"--rdzv-endpoint", "h:x", "prog"}),
            "--rdzv-endpoint: expected a port number (1-65535), got 'h:x'");
}

// One process a pod or worker: Volcano, Kubeflow v1 without nprocPerNode, Ray Train.
TEST(LaunchOptions, PerPodRankAndWorldSizeMeanOneProcessWhereNoOptionSaysOtherwise) {
  // Ray Train's second worker on its first host.
  const Env ray = {{"RANK", "1"},       {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "1"},
                   {"NODE_RANK", "0"},  {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.5"},
                   {"MASTER_PORT", "29501"}};
  auto o = parse({"prog"}, ray);
  EXPECT_EQ(o.nproc, 1);
  EXPECT_EQ(o.nnodes, 4);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.5");
  EXPECT_EQ(o.master_port, 29501);
  ASSERT_EQ(o.read_from.size(), 1u);
  EXPECT_EQ(o.read_from[0],
            "RANK 1 and WORLD_SIZE 4: one process in this pod or worker, rank 1 of 4");
  const auto env = ddp::launch::worker_env(o, 0, 29501, 0, {});
  EXPECT_EQ(env.at("RANK"), "1");
  EXPECT_EQ(env.at("WORLD_SIZE"), "4");
  EXPECT_EQ(env.at("LOCAL_RANK"), "1");  // Ray's, as it gave it
  EXPECT_EQ(env.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env.at("GROUP_RANK"), "0");       // Ray's NODE_RANK: ranks 0 and 1 share a host
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");  // two ranks share the host
  // Volcano: RANK and WORLD_SIZE alone.
  o = parse({"prog"}, {{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "m"}});
  EXPECT_EQ(ddp::launch::worker_env(o, 0, 29500, 0, {}).at("LOCAL_RANK"), "0");
  EXPECT_EQ(ddp::launch::worker_env(o, 0, 29500, 0, {}).at("LOCAL_WORLD_SIZE"), "1");
  EXPECT_EQ(ddp::launch::worker_env(o, 0, 29500, 0, {}).at("GROUP_RANK"), "2");
  // An option that shapes the job wins over them: RANK and WORLD_SIZE are then not read, nor
  // NODE_RANK on one node (where only rank 0 exists: one left in the shell is no error).
  o = parse({"--nproc", "2", "prog"}, ray);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.nproc, 2);
  EXPECT_EQ(o.given_local_rank, -1);
  EXPECT_TRUE(o.read_from.empty());
  EXPECT_EQ(parse({"prog"}, {{"NODE_RANK", "3"}}).node_rank, 0);
  EXPECT_EQ(error_of({"--nnodes", "2", "prog"}, {{"NODE_RANK", "2"}}),
            "NODE_RANK: expected an integer from 0 to 1, got '2'");
  EXPECT_EQ(error_of({"prog"}, {{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "RANK: expected an integer from 0 to 3, got '4'");
  // NODE_RANK alone: this node's rank.
  o = parse({"--nnodes", "2", "--nproc", "2", "prog"}, {{"NODE_RANK", "1"}, {"MASTER_ADDR", "m"}});
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "m");
  EXPECT_EQ(parse({"--nnodes", "2", "--node-rank", "0", "prog"}, {{"NODE_RANK", "1"}}).node_rank,
            0);
}

TEST(LaunchOptions, NprocCpuCountsTheCoresAndGpuNeedsOne) {
  EXPECT_EQ(parse_launch_args({"--nproc-per-node", "cpu", "prog"}, {}, 0, 6).nproc, 6);
  EXPECT_EQ(parse_launch_args({"prog"}, {{"PET_NPROC_PER_NODE", "cpu"}}, 2, 6).nproc, 6);
  EXPECT_EQ(parse_launch_args({"--nproc", "gpu", "prog"}, {}, 4, 6).nproc, 4);
  EXPECT_EQ(error_of({"--nproc", "gpu", "prog"}), "--nproc gpu: no GPU is visible on this node");
  EXPECT_EQ(error_of({"--nproc", "many", "prog"}),
            "--nproc: expected a positive integer, auto, cpu or gpu, got 'many'");
}

TEST(LaunchOptions, NprocAutoCountsTheVisibleGpus) {
  EXPECT_EQ(parse({"--nproc", "auto", "prog"}, {}, 0).nproc, 1);
  EXPECT_EQ(parse({"--nproc", "auto", "prog"}, {}, 8).nproc, 8);
  EXPECT_EQ(parse({"--nproc", "auto", "prog"}, {{"CUDA_VISIBLE_DEVICES", "2,5"}}, 8).nproc, 2);
  EXPECT_EQ(ddp::launch::auto_nproc("", 8), 1);
}

TEST(LaunchOptions, DevicesGiveOneGpuPerLocalRank) {
  EXPECT_EQ(parse({"--devices", "0,1", "prog"}).nproc, 2);
  EXPECT_EQ(error_of({"--nproc", "4", "--devices", "0,1", "prog"}),
            "--devices lists 2 GPU(s) for 4 process(es) per node: give one per local rank");
  const auto o = parse({"--devices", "3,1", "prog"});
  const auto env = ddp::launch::worker_env(o, 1, 29500, 0, {});
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "3,1");  // cuda:1 of local rank 1 is GPU 1
}

TEST(LaunchOptions, BadInputNamesTheOption) {
  EXPECT_EQ(error_of({"--nproc", "0", "prog"}),
            "--nproc: expected a positive integer, auto, cpu or gpu, got '0'");
  EXPECT_EQ(error_of({"--bogus", "prog"}), "unknown option '--bogus' (see launcher --help)");
  EXPECT_EQ(error_of({"--nnodes", "2", "--node-rank", "2", "prog"}),
            "--node-rank 2 is not below --nnodes 2 (node ranks are 0 .. 1)");
  EXPECT_EQ(error_of({"--master-port", "70000", "prog"}),
            "--master-port: expected a port number (1-65535), got '70000'");
  EXPECT_EQ(error_of({"--nproc", "2", "--local-ranks-filter", "0,2", "prog"}),
            "--local-ranks-filter: local rank 2 does not exist with --nproc 2");
  EXPECT_EQ(error_of({"--nproc", "2"}),
            "no program to launch (usage: launcher [options] PROGRAM [ARGS...])");
  EXPECT_EQ(error_of({"--log-dir"}), "--log-dir: expected DIR after it");
}

TEST(LaunchOptions, WorkersGetTorchrunsEnvWithRanksNumberedNodeByNode) {
  const auto o = parse({"--nnodes", "3", "--node-rank", "1", "--nproc", "4", "--master-addr",
                        "node0", "--max-restarts", "2", "--run-id", "r1", "prog"});
  const auto env = ddp::launch::worker_env(o, 2, 29500, 1, {});
  EXPECT_EQ(env, (Env{{"RANK", "6"},
                      {"LOCAL_RANK", "2"},
                      {"GROUP_RANK", "1"},
                      {"LOCAL_WORLD_SIZE", "4"},
                      {"WORLD_SIZE", "12"},
                      {"MASTER_ADDR", "node0"},
                      {"MASTER_PORT", "29500"},
                      {"TORCHELASTIC_RESTART_COUNT", "1"},
                      {"TORCHELASTIC_MAX_RESTARTS", "2"},
                      {"TORCHELASTIC_RUN_ID", "r1"},
                      {"OMP_NUM_THREADS", "1"},
                      {"USE_LIBUV", "0"}}));
  // OMP_NUM_THREADS: only with several processes, and never over the user's.
  EXPECT_EQ(
      ddp::launch::worker_env(o, 0, 1, 0, {{"OMP_NUM_THREADS", "4"}}).count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(ddp::launch::worker_env(parse({"prog"}), 0, 1, 0, {}).count("OMP_NUM_THREADS"), 0u);
  // USE_LIBUV=0 (Python's store without libuv), never over the user's.
  EXPECT_EQ(ddp::launch::worker_env(o, 0, 1, 0, {{"USE_LIBUV", "1"}}).count("USE_LIBUV"), 0u);
}

TEST(LaunchOptions, TheJobTokenAndFlightDirReachTheWorkers) {
  auto o = parse({"prog"});
  o.job_token = "3f9a";
  o.flight_dir = "/tmp/ddp-launcher-x";
  const auto env = ddp::launch::worker_env(o, 0, 29500, 0, {});
  EXPECT_EQ(env.at("DDP_JOB_TOKEN"), "3f9a");
  EXPECT_EQ(env.at("DDP_FLIGHT_DIR"), "/tmp/ddp-launcher-x");
  EXPECT_EQ(ddp::launch::worker_env(parse({"prog"}), 0, 1, 0, {}).count("DDP_JOB_TOKEN"), 0u);

  // One node makes up a token; nodes of one job cannot, so they share the user's or have none.
  EXPECT_EQ(ddp::launch::choose_job_token(1, {}, "fresh"), "fresh");
  EXPECT_EQ(ddp::launch::choose_job_token(2, {}, "fresh"), "");
  EXPECT_EQ(ddp::launch::choose_job_token(2, {{"DDP_JOB_TOKEN", "shared"}}, "fresh"), "shared");
  EXPECT_EQ(ddp::launch::choose_job_token(1, {{"DDP_JOB_TOKEN", "shared"}}, "fresh"), "shared");
  EXPECT_EQ(ddp::launch::choose_job_token(1, {{"DDP_JOB_TOKEN", ""}}, "fresh"), "fresh");
}

TEST(LaunchOptions, CaughtSignalsAreReadFromProcStatus) {
  // SigCgt of a process that catches SIGUSR1 (10) and SIGTERM (15): bits 9 and 14.
  const std::string status =
      "Name:\tddp_train\nSigIgn:\t0000000000001000\nSigCgt:\t0000000000004200\nCapInh:\t0\n";
  EXPECT_TRUE(ddp::launch::catches_signal(status, SIGUSR1));
  EXPECT_TRUE(ddp::launch::catches_signal(status, SIGTERM));
  EXPECT_FALSE(ddp::launch::catches_signal(status, SIGUSR2));
  EXPECT_FALSE(ddp::launch::catches_signal(status, SIGPIPE));  // ignored (SigIgn), not caught
  EXPECT_FALSE(ddp::launch::catches_signal("Name:\tx\n", SIGUSR1));
  EXPECT_FALSE(ddp::launch::catches_signal("Name:\tx\nSigCgt:\tzz\n", SIGUSR1));
}

TEST(LaunchOptions, AWorkersEndIsDescribedWithTheSignalName) {
  // waitpid statuses as the kernel encodes them.
  const int killed = SIGKILL;   // terminated by signal 9
  const int exited_3 = 3 << 8;  // exit(3)
  EXPECT_TRUE(WIFSIGNALED(killed));
  EXPECT_EQ(ddp::launch::describe_status(killed), "signal SIGKILL (9)");
  EXPECT_EQ(ddp::launch::describe_status(SIGSEGV), "signal SIGSEGV (11)");
  EXPECT_EQ(ddp::launch::describe_status(exited_3), "exit code 3");
  EXPECT_EQ(ddp::launch::exit_code_of(killed), 137);
  EXPECT_EQ(ddp::launch::exit_code_of(exited_3), 3);
}

TEST(LaunchOptions, ProgramsAreFoundInPathOnlyWhenExecutable) {
  EXPECT_EQ(ddp::launch::find_program("sh", "/nonexistent:/bin:/usr/bin"), "/bin/sh");
  EXPECT_EQ(ddp::launch::find_program("/bin/sh", ""), "/bin/sh");
  EXPECT_FALSE(ddp::launch::find_program("no-such-program-xyz", "/bin:/usr/bin"));
  const std::string plain = ::testing::TempDir() + "/launch-not-executable.txt";
  std::ofstream(plain) << "data";
  EXPECT_FALSE(ddp::launch::find_program(plain, ""));       // not executable
  EXPECT_FALSE(ddp::launch::find_program("/usr/bin", ""));  // a directory
}

// --nnodes MIN:MAX is elastic; N is not.
TEST(LaunchOptions, NnodesMinMaxIsElastic) {
  EXPECT_FALSE(parse({"--nnodes", "1", "prog"}).elastic);
  const LaunchOptions elastic = parse({"--nnodes", "1:1", "--nproc", "3", "prog"});
  EXPECT_TRUE(elastic.elastic);
  EXPECT_EQ(elastic.nnodes, 1);
  const LaunchOptions nodes =
      parse({"--nnodes", "2:4", "--node-rank", "3", "--node-timeout", "2.5", "prog"});
  EXPECT_TRUE(nodes.elastic);
  EXPECT_EQ(nodes.min_nnodes, 2);
  EXPECT_EQ(nodes.nnodes, 4);
  EXPECT_EQ(nodes.node_timeout, 2.5);
  EXPECT_NE(error_of({"--nnodes", "2:1", "prog"}).find("MIN:MAX with MIN at most MAX"),
            std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "1:2", "--node-rank", "2", "prog"}).find("is not below"),
            std::string::npos);
  EXPECT_NE(error_of({"--node-timeout", "0", "prog"}).find("a number of seconds > 0"),
            std::string::npos);
}

// --warm-spare: elastic only (a plain launch restarts the whole group, never one worker).
TEST(LaunchOptions, AWarmSpareIsForAnElasticJobOnly) {
  EXPECT_FALSE(parse({"--nnodes", "1:1", "prog"}).warm_spare);
  EXPECT_TRUE(parse({"--nnodes", "1:1", "--warm-spare", "prog"}).warm_spare);
  EXPECT_TRUE(parse({"--nnodes", "1:2", "prog"}, {{"DDP_LAUNCH_WARM_SPARE", "1"}}).warm_spare);
  EXPECT_NE(error_of({"--warm-spare", "prog"}).find("--warm-spare: only an elastic job"),
            std::string::npos);
}

// The spare's environment: the launcher's and a worker's threads, the job's WORLD_SIZE without a
// RANK (a scheduler's RANK for the launcher dropped), so that a program that does not know the
// spare fails at torchrun's rendezvous instead of joining; no rendezvous of the workers' own.
TEST(LaunchOptions, TheWarmSparesEnvironmentHasAWorldSizeButNoRank) {
  const LaunchOptions o = parse({"--nnodes", "1:1", "--nproc", "3", "--warm-spare", "prog"});
  const Env spare =
      ddp::launch::warm_spare_env(o, 29511, {{"RANK", "4"}, {"PATH", "/bin"}, {"HOME", "/h"}});
  EXPECT_EQ(spare.count("RANK"), 0u);
  EXPECT_EQ(spare.at("WORLD_SIZE"), "3");
  EXPECT_EQ(spare.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(spare.at("PATH"), "/bin");
  EXPECT_EQ(spare.at("HOME"), "/h");
  EXPECT_EQ(spare.count("MASTER_PORT"), 0u);
  EXPECT_EQ(spare.count("LOCAL_RANK"), 0u);
  EXPECT_EQ(spare.count("DDP_ELASTIC_ID"), 0u);
}

// The warm spare's requests carry a worker's whole environment: it comes back as it was sent,
// values with '=' and empty ones included; a message that is no environment is refused.
TEST(WarmSpare, AnEnvironmentComesBackAsItWasSent) {
  const Env env = {{"RANK", "2"}, {"EMPTY", ""}, {"OPTS", "a=b c=d"}, {"PATH", "/bin:/usr/bin"}};
  const std::string message = ddp::spare::encode_env(env);
  EXPECT_EQ(std::count(message.begin(), message.end(), '\0'), 4);
  EXPECT_EQ(ddp::spare::decode_env(message), env);
  EXPECT_TRUE(ddp::spare::decode_env("").empty());
  EXPECT_THROW(ddp::spare::decode_env(std::string("RANK=1\0NOVALUE\0", 16)), ddp::Error);
  EXPECT_THROW(ddp::spare::decode_env(std::string("=1\0", 3)), ddp::Error);
}

// The membership keys' values, both ways (comm/elastic/elastic_keys.h).
TEST(ElasticKeys, MembersAndDecisionsReadBackAsWritten) {
  using ddp::comm::StepDecision;
  const std::vector<std::string> members = {"0.0", "2.0", "1.1"};
  EXPECT_EQ(ddp::comm::format_members(members), "0.0,2.0,1.1");
  EXPECT_EQ(ddp::comm::parse_members("0.0,2.0,1.1"), members);
  EXPECT_TRUE(ddp::comm::parse_members("").empty());
  for (auto d : {StepDecision::kCommit, StepDecision::kCommitAndGrow, StepDecision::kAbort}) {
    EXPECT_EQ(ddp::comm::parse_decision(ddp::comm::to_string(d)), d);
  }
  EXPECT_THROW(ddp::comm::parse_decision("maybe"), ddp::Error);
  EXPECT_EQ(ddp::comm::ElasticKeys::decision(3, 17), "elastic/gen/3/decide/17");
}

// The events of the nodes' launchers (Note [Elastic nodes]), both ways.
TEST(ElasticKeys, NodeEventsReadBackAsWritten) {
  using ddp::comm::NodeEvent;
  using Kind = NodeEvent::Kind;
  for (const NodeEvent& e :
       {NodeEvent{Kind::kNode, 1, "1.0.0,1.1.0", ""}, NodeEvent{Kind::kJoin, 2, "2.0.1", ""},
        NodeEvent{Kind::kLost, 1, "1.1.0", "worker 1.1.0 (pid 7): signal x"},
        NodeEvent{Kind::kDone, 0, "0.0.0", ""}}) {
    const std::string text = ddp::comm::format_event(e);
    const NodeEvent back = ddp::comm::parse_event(text);
    EXPECT_EQ(back.kind, e.kind) << text;
    EXPECT_EQ(back.node, e.node) << text;
    EXPECT_EQ(back.ids, e.ids) << text;
    EXPECT_EQ(back.what, e.what) << text;
  }
  EXPECT_EQ(ddp::comm::format_event({Kind::kLost, 1, "1.0.0", "signal SIGKILL (9)"}),
            "lost 1 1.0.0 signal SIGKILL (9)");
  EXPECT_THROW(ddp::comm::parse_event("gone 1 1.0.0"), ddp::Error);
  EXPECT_THROW(ddp::comm::parse_event("join -1 1.0.0"), ddp::Error);
  EXPECT_THROW(ddp::comm::parse_event("join 1"), ddp::Error);
}

}  // namespace
