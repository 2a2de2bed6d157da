// Jobs as Kubernetes runs them, on this machine: each pod a network namespace
// (tests/support/netns.h) with its own host name (a UTS namespace) and its own /etc/hosts (a mount
// namespace, a file of the test's bound over /etc/hosts), started with exactly the environment its
// operator gives the container and `launcher ddp_train --config configs/fashion_mnist_mlp.yaml`,
// no launcher option. The master's Service name enters the other pods' hosts files only 5 s after
// they start, as a Service publishes a pod once it is ready. Each job must train as the same job
// of launchers given options does, bit for bit. Needs root and iproute2, as CI has.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <thread>

#include "built_paths.h"
#include "netns.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::Child;
using ddp::testing::config;
using ddp::testing::NetnsHosts;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;
using Env = std::map<std::string, std::string>;

constexpr const char* kJob = "mnist";  // the job's name, in its pods' and Services' names

// A container's own variables (its image's, and what the kubelet sets) before the operator's.
Env container_env(const std::string& pod_name) {
  return {{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
          {"HOME", "/root"},
          {"HOSTNAME", pod_name}};
}

// One process (a launcher) in a pod: in host `host`'s network namespace, named `pod_name`, with
// `hosts_file` as its /etc/hosts and nothing but `env` in its environment.
std::vector<std::string> in_pod(const NetnsHosts& hosts, int host, const std::string& pod_name,
                                const std::string& hosts_file, const Env& env,
                                const std::vector<std::string>& argv) {
  std::vector<std::string> inner = {
      "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
      R"(hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec env -i "$@")", pod_name,
      hosts_file};
  for (const auto& [key, value] : env) inner.push_back(key + "=" + value);
  inner.insert(inner.end(), argv.begin(), argv.end());
  return hosts.in_host(host, inner);
}

// The ddp_train arguments of every job here: the command's own config, a short epoch.
std::vector<std::string> train_args(const std::string& out) {
  return {"--config", config("fashion_mnist_mlp.yaml"), "--epochs", "1", "--train-subset", "512",
          "--batch-size", "32", "--eval-every", "0", "--output-dir", out};
}

struct Process {
  int host;
  std::string pod;  // its pod's name, which is its host name
  Env env;          // the operator's variables
  std::vector<std::string> launcher_options;
};

// A job of `processes` on `hosts`: each host's hosts file names its own pod from the start and
// every other pod (the master's Service among them) 5 s after the start when `late`. Returns
// every launcher's result, in order, after all ended (180 s at most).
std::vector<ProcessResult> run_job(const NetnsHosts& hosts, const std::vector<Process>& processes,
                                   const std::string& out, bool late) {
  TempDir etc;
  std::map<int, std::string> pod_of_host;
  for (const auto& p : processes) pod_of_host.emplace(p.host, p.pod);
  auto write_hosts = [&](bool everyone) {
    for (const auto& [host, pod] : pod_of_host) {
      std::ofstream f(etc.file("hosts-" + std::to_string(host)));  // in place: the bind keeps it
      f << "127.0.0.1 localhost\n";
      for (const auto& [other, name] : pod_of_host) {
        if (other == host || everyone) f << NetnsHosts::address(other) << " " << name << "\n";
      }
    }
  };
  write_hosts(!late);
  std::vector<std::unique_ptr<Child>> children;
  for (const auto& p : processes) {
    Env env = container_env(p.pod);
    for (const auto& [key, value] : p.env) env[key] = value;
    std::vector<std::string> argv = {DDP_LAUNCHER_BIN};
    argv.insert(argv.end(), p.launcher_options.begin(), p.launcher_options.end());
    argv.push_back(DDP_TRAIN_BIN);
    for (const auto& a : train_args(out)) argv.push_back(a);
    children.push_back(std::make_unique<Child>(
        in_pod(hosts, p.host, p.pod, etc.file("hosts-" + std::to_string(p.host)), env, argv),
        Env{}));
  }
  if (late) {
    std::this_thread::sleep_for(seconds(5));
    write_hosts(true);
  }
  const auto deadline = Clock::now() + seconds(180);
  std::vector<ProcessResult> results;
  for (auto& child : children) results.push_back(child->wait_until(deadline));
  return results;
}

// The same job's launchers given options, each in its pod, with no operator variable.
std::vector<Process> given_options(std::vector<Process> processes, int nproc, int port) {
  const int nnodes = static_cast<int>(processes.size());
  for (int i = 0; i < nnodes; ++i) {
    processes[i].env.clear();
    processes[i].launcher_options = {"--nnodes",      std::to_string(nnodes),
                                     "--node-rank",   std::to_string(i),
                                     "--nproc",       std::to_string(nproc),
                                     "--master-addr", processes[0].pod,
                                     "--master-port", std::to_string(port)};
  }
  return processes;
}

void expect_trained_as_four(const std::vector<ProcessResult>& results) {
  for (const auto& r : results) EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(results[0].output.find("launched by env: 4 rank(s)"), std::string::npos)
      << results[0].output;
}


// Kubeflow's PyTorchJob (training-operator v1), a Master and a Worker of nprocPerNode 2: every
// pod gets MASTER_ADDR and MASTER_PORT (the master's Service), WORLD_SIZE (every process of the
// job), RANK (the pod's index), and torchrun's PET_* (TrainJob's torch plugin sets the same
// PET_* variables).
TEST(Pods, APyTorchJobOfTwoPodsTrainsAsTwoLaunchersGivenOptions) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  const std::string port = std::to_string(ddp::testing::free_port());
  const std::string master = std::string(kJob) + "-master-0";
  std::vector<Process> pods;
  for (int i = 0; i < 2; ++i) {
    pods.push_back({i,
                    i == 0 ? master : std::string(kJob) + "-worker-0",
                    {{"PYTHONUNBUFFERED", "1"},
                     {"MASTER_ADDR", master},
                     {"PET_MASTER_ADDR", master},
                     {"MASTER_PORT", port},
                     {"PET_MASTER_PORT", port},
                     {"WORLD_SIZE", "4"},
                     {"RANK", std::to_string(i)},
                     {"PET_NODE_RANK", std::to_string(i)},
                     {"PET_NPROC_PER_NODE", "2"},
                     {"PET_NNODES", "2"}},
                    {}});
  }
  TempDir job, reference;
  const auto results = run_job(hosts, pods, job.path(), true);
  expect_trained_as_four(results);
  EXPECT_NE(results[1].output.find(
                "[launcher] read from the environment: PET_MASTER_ADDR, PET_MASTER_PORT, "
                "PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE"),
            std::string::npos)
      << results[1].output;
  EXPECT_NE(results[1].output.find("[launcher] --master-addr " + master + " does not resolve yet"),
            std::string::npos)
      << results[1].output;
  EXPECT_NE(results[1].output.find("[launcher] --master-addr " + master + " resolved after"),
            std::string::npos)
      << results[1].output;
  expect_trained_as_four(run_job(hosts, given_options(pods, 2, ddp::testing::free_port()),
                                 reference.path(), false));
  ddp::testing::expect_same_weights(job.file("model.pt"), reference.file("model.pt"));
}

// Ray Train starts each worker itself, several a host, and sets torchrun's per-process variables
// and NODE_RANK: a launcher in each worker runs that one process.
TEST(Pods, RayTrainsFourWorkersOnTwoHostsAsTwoLaunchersGivenOptions) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(2);
  const std::string port = std::to_string(ddp::testing::free_port());
  std::vector<Process> workers;
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2;
    workers.push_back({node,
                       "ray-node-" + std::to_string(node),
                       {{"RANK", std::to_string(rank)},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", std::to_string(rank % 2)},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"NODE_RANK", std::to_string(node)},
                        {"MASTER_ADDR", NetnsHosts::address(0)},  // Ray gives rank 0's address
                        {"MASTER_PORT", port}},
                       {}});
  }
  TempDir job, reference;
  const auto results = run_job(hosts, workers, job.path(), false);
  expect_trained_as_four(results);
  EXPECT_NE(results[3].output.find("[launcher] read from the environment: RANK 3 and WORLD_SIZE "
                                   "4: one process in this pod or worker, rank 3 of 4"),
            std::string::npos)
      << results[3].output;
  // The reference: a launcher of 2 processes a host.
  const std::vector<Process> nodes = {workers[0], workers[2]};
  expect_trained_as_four(
      run_job(hosts, given_options(nodes, 2, ddp::testing::free_port()), reference.path(), false));
  ddp::testing::expect_same_weights(job.file("model.pt"), reference.file("model.pt"));
}

// One process a pod, from per-pod RANK and WORLD_SIZE alone (Volcano's PyTorch plugin; Kubeflow's
// PyTorchJob without nprocPerNode sets the same, PET_NNODES aside).
TEST(Pods, FourPodsOfOneProcessFromRankAndWorldSizeTrainAsFourLaunchersGivenOptions) {
  ASSERT_TRUE(NetnsHosts::can_make()) << "needs root and iproute2 (ip netns); CI runs as root";
  NetnsHosts hosts(4);
  const std::string port = std::to_string(ddp::testing::free_port());
  const std::string master = std::string(kJob) + "-master-0";
  std::vector<Process> pods;
  for (int i = 0; i < 4; ++i) {
    pods.push_back({i,
                    i == 0 ? master : std::string(kJob) + "-worker-" + std::to_string(i - 1),
                    {{"MASTER_ADDR", master},
                     {"MASTER_PORT", port},
                     {"WORLD_SIZE", "4"},
                     {"RANK", std::to_string(i)}},
                    {}});
  }
  TempDir job, reference;
  expect_trained_as_four(run_job(hosts, pods, job.path(), true));
  expect_trained_as_four(run_job(hosts, given_options(pods, 1, ddp::testing::free_port()),
                                 reference.path(), false));
  ddp::testing::expect_same_weights(job.file("model.pt"), reference.file("model.pt"));
}

}  // namespace
