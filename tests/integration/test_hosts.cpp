// Several hosts on this machine, played by network namespaces on a bridge (tests/support/netns.h):
// two launchers as two nodes, and mpirun across the two, train as 4 ranks on one host do; gloo
// finds the interface that reaches the master by itself; a link that goes down ends every rank,
// unless the job is elastic: then the other host goes on and the host's ranks rejoin.
// Needs root and iproute2, as CI has.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "built_paths.h"
#include "elastic_log.h"
#include "netns.h"
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
using ddp::testing::mlp_args;
using ddp::testing::NetnsHosts;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// The launcher of node `node` of 2 (2 workers each) in host `node`, the master on host 0.
std::vector<std::string> node_launcher(const NetnsHosts& hosts, int node, int port,
                                       const std::vector<std::string>& args,
                                       std::vector<std::string> options = {}) {
  options.insert(options.end(),
                 {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc", "2",
                  "--master-addr", NetnsHosts::address(0), "--master-port", std::to_string(port)});
  return hosts.in_host(node, launch(options, args));
}

// The same secret on both nodes, as across real machines (else the launcher warns).
const std::map<std::string, std::string> kJobEnv = {{"DDP_JOB_TOKEN", "hosts-test-token"}};

// A job of 2 nodes of 2 workers, node 0 with ddp_train arguments `args0` and node 1 with `args1`:
// both launchers' results, node 1 waited for first (up to 180 s), then node 0.
std::pair<ProcessResult, ProcessResult> run_two_nodes(const NetnsHosts& hosts, int port,
                                                      const std::vector<std::string>& args0,
                                                      const std::vector<std::string>& args1) {
  Child node0(node_launcher(hosts, 0, port, args0), kJobEnv);
  Child node1(node_launcher(hosts, 1, port, args1), kJobEnv);
  ProcessResult r1 = node1.wait_until(Clock::now() + seconds(180));
  ProcessResult r0 = node0.wait_until(Clock::now() + seconds(30));
  return {std::move(r0), std::move(r1)};
}


TEST(Hosts, TwoLaunchersInTwoNamespacesTrainAsFourRanksOnOneHost) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir nodes, node1_out, one_host;
  const int port = ddp::testing::free_port();
  // No GLOO_SOCKET_IFNAME: "vm" resolves to 127.0.0.1 here, so gloo must find the interface
  // that routes to MASTER_ADDR by itself.
  // The flat all-reduce, whose sums the one-host run repeats bit for bit (two nodes of two ranks
  // would all-reduce hierarchically by default, summing in another order: to float rounding).
  const std::vector<std::string> flat = {"--hierarchical", "false"};
  auto node_args = [&](const TempDir& out) {
    auto args = mlp_args(out.path(), 2);
    args.insert(args.end(), flat.begin(), flat.end());
    return args;
  };
  const auto [r0, r1] = run_two_nodes(hosts, port, node_args(nodes), node_args(node1_out));
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r0.output.find("[rank 0] "), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("launched by env: 4 rank(s), backend gloo"), std::string::npos)
      << r0.output;
  EXPECT_NE(
      r0.output.find("gloo: interface " + NetnsHosts::ifname(0) + " (" + NetnsHosts::address(0) +
                     ") routes to MASTER_ADDR " + NetnsHosts::address(0)),
      std::string::npos)
      << r0.output;
  EXPECT_NE(r1.output.find("[launcher] rank 3: pid"), std::string::npos) << r1.output;

  // On one host the default would be shared memory, which sums in rank order: gloo, as above.
  auto one_args = mlp_args(one_host.path(), 2);
  one_args.insert(one_args.end(), {"--backend", "gloo"});
  auto one = ddp::testing::run_process(launch({"--nproc", "4"}, one_args), {}, seconds(180));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // Rank 0 (node 0) writes the weights; gloo adds the same gradients in the same order whether
  // its pairs are on loopback or a veth: bitwise equal.
  expect_same_weights(nodes.file("model.pt"), one_host.file("model.pt"));
}

// Hybrid sharding on 2 hosts of 2 ranks: each host's ranks shard the MLP, the hosts replicate it
// (each shard's gradient all-reduced across the hosts after the host's reduce-scatter); it trains
// as DDP on 4 ranks does, to float rounding (its sums run in another order).
TEST(Hosts, HybridShardingOnTwoHostsOfTwoTrainsAsDdpOnFour) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir nodes, node1_out, one_host;
  const int port = ddp::testing::free_port();
  auto node_args = [&](const TempDir& out) {
    auto args = mlp_args(out.path(), 1);
    args.insert(args.end(), {"--parallel", "hsdp"});
    return args;
  };
  const auto [r0, r1] = run_two_nodes(hosts, port, node_args(nodes), node_args(node1_out));
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r0.output.find("hybrid sharding: 2 hosts of 2 rank(s)"), std::string::npos)
      << r0.output;
  auto one_args = mlp_args(one_host.path(), 1);
  one_args.insert(one_args.end(), {"--backend", "gloo"});
  auto one = ddp::testing::run_process(launch({"--nproc", "4"}, one_args), {}, seconds(180));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ddp::testing::expect_close_weights(nodes.file("model.pt"), one_host.file("model.pt"), 1e-5);
}

// Open MPI's rsh launcher runs `AGENT HOST COMMAND...` as it would run ssh, COMMAND being a line
// for the remote shell; here HOST is a namespace's name and the "remote shell" runs inside it.
// Each host gets its own TMPDIR under `dir`: the namespaces share this machine's /tmp and host
// name, so their orteds would share one session directory (ompi.<hostname>.<uid>/jf.<job
// family>) and overwrite each other's files there (seen: a segfault in
// hwloc_shmem_topology_write, "PMIX ERROR: ... dstore_base.c at line 1709"); real hosts have a
// /tmp each. Each call is logged to dir/agent.log, to show that both hosts were entered.
std::string write_rsh_agent(const TempDir& dir) {
  const std::string path = dir.file("netns-rsh");
  ddp::testing::write_file(path, R"(#!/bin/sh
dir=$(dirname "$0"); host=$1; shift
echo "$host" >> "$dir/agent.log"
mkdir -p "$dir/$host"
exec nsenter --net=/run/netns/"$host" env TMPDIR="$dir/$host" sh -c "$*"
)");
  ::chmod(path.c_str(), 0755);
  return path;
}

TEST(Hosts, MpirunAcrossTwoNamespacesTrainsWithTheMpiBackend) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir dir, across, one_host;
  const std::string agent = write_rsh_agent(dir);
  const std::string subnet = NetnsHosts::subnet();
  // mpirun stays in the root namespace: it reaches the orteds it starts in the namespaces (and
  // they it) over the bridge's address, 10.213.0.254. The host names are the namespaces' names:
  // not this machine's, so Open MPI starts an orted on each through the agent and sees 2 nodes.
  // btl self,tcp is needed: the ranks of both namespaces report the same host name, so Open MPI
  // takes them for one node and tries shared memory (vader) between them, which segfaults in
  // mca_btl_vader_poll_handle_frag. The orteds' (oob) and the ranks' (btl) TCP keep to the test
  // subnet, as a job would keep to its cluster network (not needed here, where the namespaces
  // have no other interface, but the root namespace's mpirun has).
  std::vector<std::string> argv = {DDP_MPIEXEC,
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "-np",
                                   "4",
                                   "--host",
                                   NetnsHosts::name(0) + ":2," + NetnsHosts::name(1) + ":2",
                                   "--mca",
                                   "plm_rsh_agent",
                                   agent,
                                   "--mca",
                                   "oob_tcp_if_include",
                                   subnet,
                                   "--mca",
                                   "btl",
                                   "self,tcp",
                                   "--mca",
                                   "btl_tcp_if_include",
                                   subnet,
                                   DDP_TRAIN_BIN};
  const auto args = mlp_args(across.path(), 2);
  argv.insert(argv.end(), args.begin(), args.end());
  // Named, not left to the default: Open MPI 5 counts the two namespaces as one node in its
  // local size too (the same host name), so the one-host default, shm, would apply; a real
  // second host has its own name and the default there is mpi (Launch.Mpirun tests the rule).
  argv.insert(argv.end(), {"--backend", "mpi"});
  const ProcessResult r = ddp::testing::run_process(argv, {}, seconds(180));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("launched by mpirun: 4 rank(s), backend mpi"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("PMIX ERROR"), std::string::npos) << r.output;
  const std::string agent_log = ddp::testing::read_file(dir.file("agent.log"));
  EXPECT_NE(agent_log.find(NetnsHosts::name(0) + "\n"), std::string::npos) << agent_log;
  EXPECT_NE(agent_log.find(NetnsHosts::name(1) + "\n"), std::string::npos) << agent_log;

  std::vector<std::string> under_mpirun = mlp_args(one_host.path(), 2);
  under_mpirun.insert(under_mpirun.begin(), DDP_TRAIN_BIN);
  under_mpirun.insert(under_mpirun.end(), {"--backend", "mpi"});  // not one host's default, shm
  const ProcessResult one = ddp::testing::run_mpirun(4, under_mpirun, seconds(180));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // Open MPI's allreduce picks its algorithm by the communicator's size and the message's, not by
  // the transport: tcp across hosts and shared memory on one add in the same order, bitwise.
  expect_same_weights(across.file("model.pt"), one_host.file("model.pt"));
}

// The comm timeout of the link tests: long enough for any healthy collective of the MLP on a
// loaded 2-core machine (they take milliseconds), short for CI, which waits for it (it was 20 s).
constexpr int kLinkTestCommTimeout = 8;

// A network that fails under a running job: host 1's cable pulled after epoch 1's checkpoint.
// Nothing is sent back (no reset, no ICMP): every rank only sees its collective time out.
TEST(Hosts, ALinkDownEndsEveryRankWithinTheCommTimeout) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir out0, out1;
  const int port = ddp::testing::free_port();
  auto args = [](const TempDir& out) {
    auto a = mlp_args(out.path(), 200);
    a.insert(a.end(),
             {"--comm-timeout", std::to_string(kLinkTestCommTimeout), "--save-every", "1"});
    return a;
  };
  Child node0(node_launcher(hosts, 0, port, args(out0)), kJobEnv);
  Child node1(node_launcher(hosts, 1, port, args(out1)), kJobEnv);
  ASSERT_TRUE(node0.wait_for_output("checkpoint after epoch 1: ", Clock::now() + seconds(120)))
      << node0.output();
  std::vector<int> workers;
  for (int rank = 0; rank < 4; ++rank) {
    workers.push_back(launcher_worker_pid((rank < 2 ? node0 : node1).output(), rank));
    ASSERT_GT(workers.back(), 0) << node0.output() << node1.output();
  }
  hosts.set_link(1, false);
  const auto down = Clock::now();
  const auto deadline = down + seconds(kLinkTestCommTimeout + 15);

  // When each rank ends (the launchers reap them), measured from the link going down.
  std::vector<double> ended(4, -1.0);
  for (int left = 4; left > 0 && Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int rank = 0; rank < 4; ++rank) {
      if (ended[rank] < 0 && !ddp::testing::process_alive(workers[rank])) {
        ended[rank] = std::chrono::duration<double>(Clock::now() - down).count();
        --left;
      }
    }
  }
  for (int rank = 0; rank < 4; ++rank) {
    if (ended[rank] < 0) {
      std::printf("[ hosts    ] rank %d: still running at the deadline\n", rank);
    } else {
      std::printf("[ hosts    ] rank %d: ended %.1f s after the link went down\n", rank,
                  ended[rank]);
    }
    EXPECT_GE(ended[rank], 0.0) << "rank " << rank << " still runs at the deadline";
  }
  const ProcessResult r0 = node0.wait_until(std::max(deadline, Clock::now() + seconds(5)));
  const ProcessResult r1 = node1.wait_until(std::max(deadline, Clock::now() + seconds(5)));
  std::printf("[ hosts    ] launchers ended %.1f s after the link went down\n",
              std::chrono::duration<double>(Clock::now() - down).count());
  EXPECT_FALSE(r0.timed_out) << r0.output;
  EXPECT_FALSE(r1.timed_out) << r1.output;
  EXPECT_NE(r0.exit_code, 0) << r0.output;
  EXPECT_NE(r1.exit_code, 0) << r1.output;
  // Node 0 can tell that its collectives timed out; node 1, that node 0 cannot be reached.
  EXPECT_NE(r0.output.find("timed out after " + std::to_string(kLinkTestCommTimeout) +
                           " s on backend gloo"),
            std::string::npos)
      << r0.output;
  EXPECT_NE(r0.output.find("failed first"), std::string::npos) << r0.output;
  EXPECT_NE(r1.output.find("node 0 (--master-addr " + NetnsHosts::address(0) + ":" +
                           std::to_string(port) + ") cannot be reached from node 1: "),
            std::string::npos)
      << r1.output;
  EXPECT_TRUE(hosts.pids(0).empty());
  EXPECT_TRUE(hosts.pids(1).empty());
  // The checkpoint of the last whole epoch is intact.
  EXPECT_NO_THROW(ddp::train::read_pt_file(out0.file("checkpoint.pt")));
  if (HasFailure()) {
    std::printf("[ hosts    ] node 0's launcher:\n%s[ hosts    ] node 1's launcher:\n%s",
                r0.output.c_str(), r1.output.c_str());
  }
}

// The same pull with --max-restarts 1 and the cable back once the ranks have ended: both
// launchers restart their groups, which meet again at node 0 and resume from the last checkpoint
// in the shared output directory (a cluster's shared file system), and the job ends with the
// weights of a run that was never interrupted.
TEST(Hosts, WithARestartAndTheLinkBackTheJobEndsAsAnUninterruptedRun) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir shared, whole;
  const int port = ddp::testing::free_port();
  auto args = mlp_args(shared.path(), 10);
  // The flat all-reduce, as the one-host run's below (bitwise equal weights).
  args.insert(args.end(),
              {"--comm-timeout", std::to_string(kLinkTestCommTimeout), "--hierarchical", "false"});
  auto node = [&](int i) { return node_launcher(hosts, i, port, args, {"--max-restarts", "1"}); };
  Child node0(node(0), kJobEnv), node1(node(1), kJobEnv);
  ASSERT_TRUE(node0.wait_for_output("checkpoint after epoch 1: ", Clock::now() + seconds(120)))
      << node0.output();
  hosts.set_link(1, false);
  ASSERT_TRUE(
      node0.wait_for_output("restarting the workers (1 of 1 restarts)", Clock::now() + seconds(60)))
      << node0.output();
  ASSERT_TRUE(
      node1.wait_for_output("restarting the workers (1 of 1 restarts)", Clock::now() + seconds(60)))
      << node1.output();
  hosts.set_link(1, true);
  const ProcessResult r0 = node0.wait_until(Clock::now() + seconds(180));
  const ProcessResult r1 = node1.wait_until(Clock::now() + seconds(30));
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r0.output.find("resumed from " + shared.file("checkpoint-epoch-")), std::string::npos)
      << r0.output;

  auto whole_args = mlp_args(whole.path(), 10);
  whole_args.insert(whole_args.end(), {"--backend", "gloo"});  // as the two hosts' (flat) sums
  const auto uninterrupted =
      ddp::testing::run_process(launch({"--nproc", "4"}, whole_args), {}, seconds(180));
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  expect_same_weights(shared.file("model.pt"), whole.file("model.pt"));
}

// Elastic across two hosts (--nnodes 1:2, 2 workers each). Node 1 comes late: node 0 starts the
// job alone when the last call (the node timeout, 2 s) is over, and node 1's workers join the
// running group, healed from node 0's ranks. Then host 1's cable is pulled: node 0's ranks see
// their step time out (the comm timeout, 3 s) and go on as a group of 2, as node 1 was out of the
// job after 2 s without a heartbeat; node 1's launcher, cut off as long, stops its workers. When
// the cable is back it starts them again (2 restarts), they join again, and the job ends on both
// nodes with exit 0: node 0's workers were never restarted, and every epoch trained each sample
// once.
TEST(Hosts, ElasticALateNodeJoinsAndALinkPulledLeavesTheOtherHostTrainingUntilItRejoins) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir out;  // node 0's: rank 0 is there all along
  TempDir out1;
  const int port = ddp::testing::free_port();
  constexpr int kEpochs = 150;  // of 2 steps: 100 samples, 60 a step (15 or 30 per rank)
  // 50 ms a step while the group is smaller than 4 ranks: node 1's workers must have started
  // before it ends (the pace comes from ddp_fault_train, the tests' ddp_train).
  auto node = [&](int i, const TempDir& dir) {
    return hosts.in_host(
        i, launch({"--nnodes", "1:2", "--node-rank", std::to_string(i), "--nproc", "2",
                   "--master-addr", NetnsHosts::address(0), "--master-port", std::to_string(port),
                   "--max-restarts", "2", "--node-timeout", "2"},
                  {"--config", config("random_linear.yaml"), "--epochs", std::to_string(kEpochs),
                   "--global-batch-size", "60", "--output-dir", dir.path(), "--elastic",
                   "--record-samples", "--comm-timeout", "3", "--fault-pace", "0.05"},
                  DDP_FAULT_TRAIN_BIN));
  };
  Child node0(node(0, out), kJobEnv);
  ASSERT_TRUE(node0.wait_for_output("elastic: generation 0 of 2 worker(s) on 1 node(s)",
                                    Clock::now() + seconds(20)))
      << node0.output();
  Child node1(node(1, out1), kJobEnv);
  // Once the group of 4 (node 1's workers may join one by one, as each is ready) has committed a
  // step: the log's "step S committed by generation G of 4 rank(s), T s after the change".
  ASSERT_TRUE(node0.wait_for_output(" of 4 rank(s), ", Clock::now() + seconds(30)))
      << node0.output() << node1.output();
  hosts.set_link(1, false);
  ASSERT_TRUE(node0.wait_for_output(": 2 rank(s) (0.0.0,0.1.0), batch", Clock::now() + seconds(20)))
      << node0.output() << node1.output();
  ASSERT_TRUE(node1.wait_for_output("is out of the group: stopping its worker(s)",
                                    Clock::now() + seconds(10)))
      << node1.output();
  hosts.set_link(1, true);
  const ProcessResult r0 = node0.wait_until(Clock::now() + seconds(120));
  const ProcessResult r1 = node1.wait_until(Clock::now() + seconds(20));
  ASSERT_EQ(r0.exit_code, 0) << r0.output << r1.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output << r0.output;
  EXPECT_NE(r0.output.find("elastic: node 1 is in the job with worker(s) 1.0.0,1.1.0, which join "
                           "the running group"),
            std::string::npos)
      << r0.output;
  EXPECT_NE(r0.output.find("elastic: node 1: not heard from for "), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find(" of 2 worker(s): 0.0.0,0.1.0"), std::string::npos) << r0.output;
  EXPECT_EQ(r0.output.find("[launcher] elastic: restart "), std::string::npos) << r0.output;
  // Node 0's workers trained on through every change in the processes they started in.
  EXPECT_EQ(ddp::testing::expect_survivors_kept_their_processes(r0.output, 2, "0."), 2);
  EXPECT_NE(r1.output.find("elastic: restart 2 of 2: worker 1."), std::string::npos) << r1.output;
  EXPECT_NE(r1.output.find("elastic: node 0 says the job ended: done"), std::string::npos)
      << r1.output;
  // 2 ranks, growing to 4 (a worker at a time, or both at once), then 2 (once), then growing
  // to 4 again; after each change every rank held the same state bitwise.
  const auto changes = ddp::testing::generations_that_went_on(r0.output);
  ASSERT_GE(changes.size(), 3u) << r0.output;
  EXPECT_EQ(changes.back().world, 4) << r0.output;
  const auto shrink = std::find_if(changes.begin(), changes.end(),
                                   [](const ddp::testing::GoingOn& c) { return c.world == 2; });
  ASSERT_NE(shrink, changes.end()) << r0.output;
  ASSERT_NE(shrink, changes.begin()) << r0.output;
  EXPECT_EQ((shrink - 1)->world, 4) << r0.output;
  for (auto c = changes.begin(); c != changes.end(); ++c) {
    if (c != shrink) {
      EXPECT_GT(c->world, c == changes.begin() ? 2 : (c - 1)->world) << r0.output;
    }
    EXPECT_NE(r0.output.find("elastic: the " + std::to_string(c->world) +
                             " rank(s) hold bitwise the same state before step " +
                             std::to_string(c->after_step + 1)),
              std::string::npos)
        << r0.output;
  }
  // No sample lost, no step recorded twice or out of order, none trained twice but for the
  // sampler's padding (an epoch that starts at 3 ranks pads 100 samples to 102).
  ddp::testing::expect_each_sample_once_an_epoch(ddp::testing::read_file(out.file("samples.jsonl")),
                                                 changes, kEpochs, 2, /*first_world=*/2, 4);
  EXPECT_TRUE(hosts.pids(0).empty());
  EXPECT_TRUE(hosts.pids(1).empty());
}

// Below MIN nodes (--nnodes 2:2, no restarts): host 1's cable pulled, node 0's launcher ends the
// job non-zero, naming why, within the node and comm timeouts, and the checkpoint of the last
// whole epoch loads; node 1's launcher, with no restart to join again, ends too.
TEST(Hosts, ElasticBelowMinNodesTheJobEndsWithAClearMessage) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir out, out1;
  const int port = ddp::testing::free_port();
  auto node = [&](int i, const TempDir& dir) {
    return hosts.in_host(i, launch({"--nnodes", "2:2", "--node-rank", std::to_string(i), "--nproc",
                                    "2", "--master-addr", NetnsHosts::address(0), "--master-port",
                                    std::to_string(port), "--node-timeout", "2"},
                                   {"--config", config("random_linear.yaml"), "--epochs", "100000",
                                    "--global-batch-size", "60", "--output-dir", dir.path(),
                                    "--elastic", "--comm-timeout", "3"}));
  };
  Child node0(node(0, out), kJobEnv);
  Child node1(node(1, out1), kJobEnv);
  ASSERT_TRUE(node0.wait_for_output("checkpoint after epoch 5: ", Clock::now() + seconds(60)))
      << node0.output();
  hosts.set_link(1, false);
  const ProcessResult r0 = node0.wait_until(Clock::now() + seconds(20));
  const ProcessResult r1 = node1.wait_until(Clock::now() + seconds(10));
  EXPECT_FALSE(r0.timed_out) << r0.output;
  EXPECT_NE(r0.exit_code, 0) << r0.output;
  EXPECT_NE(r0.output.find("elastic: 1 node(s) left in the job, fewer than the 2 of --nnodes 2:2"),
            std::string::npos)
      << r0.output;
  EXPECT_FALSE(r1.timed_out) << r1.output;
  EXPECT_NE(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("too few restarts left to join again"), std::string::npos) << r1.output;
  EXPECT_NO_THROW(ddp::train::read_pt_file(out.file("checkpoint.pt")));
  EXPECT_TRUE(hosts.pids(0).empty());
  EXPECT_TRUE(hosts.pids(1).empty());
}

// Node 0's launcher (the job's store and arbiter) SIGKILLed mid-run: its workers die with it, and
// node 1, whose workers' next votes fail, ends non-zero within the node timeout and a few
// seconds, naming why (host 0 still answers, but refuses the store's port), rather than waiting
// minutes for node 0 to come back as it does for a pulled link.
TEST(Hosts, ElasticNodeZerosLauncherLostTheOtherNodeEndsWithAClearMessage) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  TempDir out, out1;
  const int port = ddp::testing::free_port();
  auto node = [&](int i, const TempDir& dir) {
    return hosts.in_host(
        i, launch({"--nnodes", "2:2", "--node-rank", std::to_string(i), "--nproc", "1",
                   "--master-addr", NetnsHosts::address(0), "--master-port", std::to_string(port),
                   "--node-timeout", "2", "--max-restarts", "2"},
                  {"--config", config("random_linear.yaml"), "--epochs", "100000", "--output-dir",
                   dir.path(), "--elastic", "--comm-timeout", "3"}));
  };
  Child node0(node(0, out), kJobEnv);
  Child node1(node(1, out1), kJobEnv);
  ASSERT_TRUE(node0.wait_for_output("checkpoint after epoch 5: ", Clock::now() + seconds(60)))
      << node0.output();
  ASSERT_EQ(::kill(node0.pid(), SIGKILL), 0);
  const ProcessResult r0 = node0.wait_until(Clock::now() + seconds(10));
  const ProcessResult r1 = node1.wait_until(Clock::now() + seconds(15));
  EXPECT_FALSE(r1.timed_out) << r1.output;
  EXPECT_NE(r1.exit_code, 0) << r1.output;
  EXPECT_NE(r1.output.find("elastic: node 0's launcher is gone (" + NetnsHosts::address(0) + ":" +
                           std::to_string(port) + " refuses connections)"),
            std::string::npos)
      << r1.output;
  EXPECT_TRUE(hosts.pids(0).empty()) << r0.output;  // node 0's worker died with its launcher
  EXPECT_TRUE(hosts.pids(1).empty());
}

}  // namespace
