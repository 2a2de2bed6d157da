#include "ddp/train/distributed.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>

#include "ddp/comm/diagnostics/collective_check.h"
#include "ddp/comm/hierarchical.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/common/socket.h"

namespace ddp::train {
namespace {

// Per rank: "host|local_rank|device"; net::host_name() gives at most 255 bytes.
constexpr size_t kTopologyBytes = 256 + 32;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// Every rank's topology on every rank: one all_gather of "host|local_rank|device" records.
std::vector<RankTopology> gather_topology(comm::ProcessGroup& group, const torch::Device& device,
                                          const RankTopology& mine) {
  const std::string record = fmt::format("{}|{}|{}", mine.host, mine.local_rank, mine.device);
  const auto texts = comm::all_gather_bytes(group, record, device, kTopologyBytes);
  std::vector<RankTopology> out;
  for (int r = 0; r < group.world_size(); ++r) {
    const std::string& text = texts[static_cast<size_t>(r)];
    const auto a = text.find('|');
    const auto b = text.rfind('|');
    out.push_back({r, text.substr(0, a), std::atoi(text.substr(a + 1, b - a - 1).c_str()),
                   text.substr(b + 1)});
  }
  return out;
}

// --elastic's default backend: the device's that survives a lost rank (not mpi).
std::string elastic_backend(const torch::Device& device) {
  return device.is_cuda() ? "nccl" : "shm";
}

// Whether `backend` can carry --elastic's generations on `device`.
bool elastic_capable(const std::string& backend, const torch::Device& device) {
  return device.is_cuda() ? backend == "nccl" : backend == "shm" || backend == "gloo";
}

// The launcher's store, DDP_ELASTIC_STORE ("host:port"), and the waits of the protocol.
comm::ElasticAgentOptions elastic_agent_options(const comm::Env& env,
                                                const comm::LaunchInfo& launch,
                                                const comm::ProcessGroupOptions& group) {
  comm::ElasticAgentOptions o;
  const auto store = env.find("DDP_ELASTIC_STORE");
  const std::string text = store == env.end() ? "" : store->second;
  const size_t colon = text.rfind(':');
  try {
    o.store_port = colon == std::string::npos ? 0 : std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    o.store_port = 0;
  }
  if (o.store_port <= 0) {
    throw InputError(fmt::format(
        "environment variable DDP_ELASTIC_STORE: expected the launcher's store as host:port, got "
        "'{}' (start ddp_train --elastic under launcher --nnodes MIN:MAX)",
        text));
  }
  o.store_host = text.substr(0, colon);
  o.token = launch.job_token;
  o.timeout = group.rendezvous_timeout;
  o.vote_timeout = group.timeout;
  return o;
}

}  // namespace

int threads_per_rank(int configured, bool omp_num_threads_set, int default_threads,
                     int affinity_cores, int host_cores, int local_world_size) {
  if (configured > 0) return configured;
  if (omp_num_threads_set || affinity_cores < 1) return 0;
  const int cores = affinity_cores < host_cores
                        ? affinity_cores  // bound by the launcher: these cores are this rank's
                        : std::max(1, affinity_cores / std::max(1, local_world_size));
  return cores < default_threads ? cores : 0;
}

int threads_for_this_process(int configured, const comm::Env& env, int local_world_size) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int affinity = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
  const int host = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return threads_per_rank(configured, env.count("OMP_NUM_THREADS") != 0, torch::get_num_threads(),
                          affinity, host, local_world_size);
}

void set_intra_op_threads(int threads) {
  torch::set_num_threads(threads);
  // LibTorch's count reaches OpenMP (and MKL), not OpenBLAS: the OpenMP build of OpenBLAS follows
  // it, the pthreads one (libopenblas0-pthread, which libopenblas-dev installs and whose
  // alternative outranks the OpenMP one) keeps one thread per core. Its matmuls then sum in another
  // order than a process whose OMP_NUM_THREADS said the same count, so equal jobs would differ in
  // their last bits. Looked up at run time: the BLAS is a choice of the host, not of our build.
  using SetThreads = void (*)(int);
  if (void* set = ::dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) {
    reinterpret_cast<SetThreads>(set)(threads);
  }
}

torch::Device resolve_device(const std::string& name, int cuda_device_count, int local_rank,
                             bool share_gpus) {
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda" && cuda_device_count == 0) {
    throw InputError("key 'device': 'cuda' requested, but this process sees no CUDA device");
  }
  if (name == "cuda" || (name == "auto" && cuda_device_count > 0)) {
    if (local_rank >= cuda_device_count && !share_gpus) {
      throw InputError(
          fmt::format("local rank {} has no GPU of its own: {} visible (one process per "
                      "GPU; check --nproc and CUDA_VISIBLE_DEVICES; --backend gloo lets ranks "
                      "share a GPU)",
                      local_rank, cuda_device_count));
    }
    return torch::Device(torch::kCUDA,
                         static_cast<c10::DeviceIndex>(local_rank % cuda_device_count));
  }
  if (name == "auto") return torch::kCPU;
  throw InputError(fmt::format("key 'device': expected auto, cpu or cuda, got '{}'", name));
}

std::string format_topology(const std::vector<RankTopology>& ranks, const std::string& backend) {
  std::string out =
      fmt::format("{} rank(s), backend {}:\n  rank  host                  local  device",
                  ranks.size(), backend);
  for (const auto& r : ranks) {
    out += fmt::format("\n  {:>4}  {:<20}  {:>5}  {}", r.rank, r.host, r.local_rank, r.device);
  }
  return out;
}

std::string hierarchy_decision(const std::string& setting, const std::vector<std::string>& hosts) {
  if (setting == "false") return "";
  const auto by_host = comm::ranks_by_host(hosts);
  const std::string why_not = comm::hierarchy_unusable_because(by_host);
  if (setting == "true" && !why_not.empty()) {
    throw InputError("key 'hierarchical': true, but " + why_not);
  }
  const size_t per_host = by_host.empty() ? 0 : by_host.front().size();
  if (setting == "auto" && (!why_not.empty() || per_host < 2)) return "";
  return fmt::format(
      "hierarchical all-reduce: {} hosts of {} rank(s): within each host, then "
      "across hosts",
      by_host.size(), per_host);
}

void join_next_generation(Distributed& d) {
  d.group.reset();  // the last generation's group first: its connections go
  d.membership = d.agent->next_membership(d.membership.generation);
  d.launch.rank = d.membership.rank;
  d.launch.world_size = d.membership.world_size();
  d.group = d.agent->make_group(d.membership, d.options, d.backend);
  if (d.check_collectives) d.group = comm::check_collectives(d.group);
}

void until_a_generation_forms(Distributed& d, const std::function<void()>& form) {
  constexpr int kMaxFailedGenerations = 5;
  for (int failed = 0;; ++failed) {
    try {
      return form();
    } catch (const comm::CommError& e) {
      // Each new generation lost a member: a few in a row are deaths one after another; more
      // are a group that cannot connect at all, which waiting longer would not mend.
      if (failed + 1 == kMaxFailedGenerations) throw;
      const std::string lost = d.agent->lost_in(d.membership.generation);
      log::warn("elastic: generation {} failed as it formed ({}){}; joining the next",
                d.membership.generation, e.what(), lost.empty() ? "" : " (lost: " + lost + ")");
      d.agent->report_failure(d.membership, e.what());
    }
  }
}

namespace {

void join_generation(Distributed& d) {
  until_a_generation_forms(d, [&d] { join_next_generation(d); });
  log::info("elastic: worker {} (pid {}), generation {} of {} rank(s): {}", d.agent->id(),
            ::getpid(), d.membership.generation, d.membership.world_size(),
            comm::format_members(d.membership.members));
}

// --elastic: the launcher's agent makes each generation's group, a joiner's included.
void start_elastic(Distributed& d, const comm::Env& env) {
  const auto id = env.find("DDP_ELASTIC_ID");
  if (id == env.end() || d.launch.launcher != comm::Launcher::kEnv ||
      !elastic_capable(d.backend, d.device)) {
    throw InputError(
        "key 'elastic': start ddp_train under launcher --nnodes MIN:MAX, on shm or gloo (CPU) or "
        "nccl (CUDA) (the launcher serves the job's store and restarts a lost worker; Open MPI "
        "cannot survive one)");
  }
  d.agent = std::make_shared<comm::ElasticAgent>(d.launch, id->second,
                                                 elastic_agent_options(env, d.launch, d.options));
  const auto join = env.find("DDP_ELASTIC_JOIN");
  d.joining = join != env.end() && join->second == "1";
  if (!d.joining) join_generation(d);
}

// A group that keeps its ranks for the whole run. Every rank joins the topology's gather, rank 0
// alone logs it (Note [Collective order is identical on all ranks]); the hosts decide whether the
// all-reduce goes within each host first.
void start_fixed(Distributed& d, const Config& config, const comm::Env& env) {
  d.group = comm::create_process_group(d.backend, d.launch, d.options, d.device.is_cuda());
  if (d.check_collectives) d.group = comm::check_collectives(d.group);
  RankTopology mine{d.launch.rank, comm::host_key(net::host_name(), env), d.launch.local_rank,
                    d.device.str()};
  const auto all = gather_topology(*d.group, d.device, mine);
  log::info("launched by {}: {}", comm::to_string(d.launch.launcher),
            format_topology(all, d.group->backend_name()));
  for (const auto& r : all) d.hosts.push_back(r.host);
  if (const auto line = hierarchy_decision(config.hierarchical, d.hosts); !line.empty()) {
    d.group = comm::hierarchical(d.group, d.hosts);
    log::info("{}", line);
  }
}

}  // namespace

Distributed init_distributed(const Config& config, const comm::Env& env) {
  Distributed d;
  d.launch = comm::detect_launch(env);
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  d.device = resolve_device(config.device, gpus, d.launch.local_rank, config.backend == "gloo");
  // --elastic: gloo or nccl even for one rank (the group may grow).
  d.backend = config.backend != "auto" ? config.backend
              : config.elastic         ? elastic_backend(d.device)
                                       : comm::default_backend(d.launch, d.device.is_cuda());
  if (!d.launch.rendezvous_origin.empty()) log::info("rendezvous: {}", d.launch.rendezvous_origin);
  d.options.timeout = to_ms(config.comm_timeout);
  d.options.rendezvous_timeout = to_ms(config.rendezvous_timeout);
  d.check_collectives =
      config.debug_collectives || comm::debug_level(env) == comm::DebugLevel::kDetail;
  // A joiner's first collectives are the model's and the state's (Trainer), not the topology's.
  if (config.elastic) {
    start_elastic(d, env);
  } else {
    start_fixed(d, config, env);
  }
  return d;
}

// Note [A joiner is ready once its own work is done]
// The launcher takes a joiner into the next generation as soon as it says it is ready, and the
// members form that generation after their next step, then wait in the state transfer for every
// member. A joiner that said so at its start loaded its data and built its model (0.45-0.63 s for
// the Fashion-MNIST MLP on a 2-core machine) while the members, already in its group, waited: a
// stop of the whole job at every grow. Said after them, the members train on meanwhile, and the
// grow stops them only for the group's connection and the state's transfer.
void join_running_group(Distributed& d) {
  d.agent->announce_ready();
  join_generation(d);
}

void agree_all_ok(const Distributed& dist, const std::exception_ptr& error,
                  const std::string& what) {
  const bool failed = comm::any_rank(*dist.group, error != nullptr, dist.device);
  if (error) std::rethrow_exception(error);
  if (failed) {
    throw Error(fmt::format("{} failed on another rank; its log says why", what));
  }
}

}  // namespace ddp::train
