#include "ddp/comm/launch_info.h"

#include <fmt/format.h>
#include <unistd.h>  // environ (declared with _GNU_SOURCE, which g++ and clang++ define)

#include <algorithm>
#include <charconv>
#include <limits>

#include "ddp/common/error.h"
#include "ddp/common/whole_number.h"

namespace ddp::comm {
namespace {

const std::string* find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int parse_env_int(const Env& env, const std::string& name, int min) {
  const std::string& text = *find(env, name);
  if (const auto value = whole_number(text, min, std::numeric_limits<int>::max())) return *value;
  throw InputError(
      fmt::format("environment variable {}='{}': expected an integer >= {}", name, text, min));
}

int env_int_or(const Env& env, const std::string& name, int min, int fallback) {
  return find(env, name) != nullptr ? parse_env_int(env, name, min) : fallback;
}

int require_env_int(const Env& env, const std::string& name, int min, const char* why) {
  if (find(env, name) == nullptr) {
    throw InputError(fmt::format("environment variable {} is not set ({})", name, why));
  }
  return parse_env_int(env, name, min);
}

// Slurm's tasks per node look like "2(x3),1": the first node's count serves, as ranks are
// placed node by node and a job that needs exact local sizes sets SLURM_NTASKS_PER_NODE.
int leading_int(const std::string& text) {
  int value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

void read_master(const Env& env, LaunchInfo& info, bool required, const char* launcher) {
  const auto why = fmt::format(
      "{} with WORLD_SIZE {} needs MASTER_ADDR and MASTER_PORT for the "
      "rendezvous store",
      launcher, info.world_size);
  if (const auto* addr = find(env, "MASTER_ADDR"); addr != nullptr && !addr->empty()) {
    info.master_addr = *addr;
  } else if (required) {
    throw InputError(fmt::format("environment variable MASTER_ADDR is not set ({})", why));
  }
  if (find(env, "MASTER_PORT") != nullptr) {
    info.master_port = parse_env_int(env, "MASTER_PORT", 1);
    if (info.master_port > 65535) {
      throw InputError(
          fmt::format("environment variable MASTER_PORT='{}': expected a port in 1-65535",
                      *find(env, "MASTER_PORT")));
    }
  } else if (required) {
    throw InputError(fmt::format("environment variable MASTER_PORT is not set ({})", why));
  }
}

// MASTER_ADDR and MASTER_PORT for a Slurm step that does not set them, as PyTorch Lightning's
// SLURMEnvironment derives them: the first host of the step's node list, and 15000 plus the last
// four digits of the job id (every task of the job computes the same pair; two jobs on one node
// differ unless their ids agree in those digits). Set variables win; what was derived is said in
// info.rendezvous_origin, which rank 0 logs.
void derive_slurm_master(const Env& env, LaunchInfo& info) {
  std::string said;
  if (find(env, "MASTER_ADDR") == nullptr || find(env, "MASTER_ADDR")->empty()) {
    for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      const auto* nodes = find(env, list);
      if (nodes == nullptr || nodes->empty()) continue;
      info.master_addr = first_slurm_host(*nodes);
      said = fmt::format("MASTER_ADDR {} from {}'s first host", info.master_addr, list);
      break;
    }
  }
  const auto* job = find(env, "SLURM_JOB_ID");
  if (job != nullptr && find(env, "MASTER_PORT") == nullptr) {
    info.master_port = slurm_port(*job);
    said += fmt::format("{}MASTER_PORT {} from SLURM_JOB_ID {}", said.empty() ? "" : ", ",
                        info.master_port, *job);
  }
  info.rendezvous_origin = said;
}

void check_ranks(const LaunchInfo& info, const char* rank_var, const char* size_var,
                 const char* local_rank_var, const char* local_size_var) {
  if (info.rank >= info.world_size) {
    throw InputError(fmt::format("environment variable {}={} must be less than {}={}", rank_var,
                                 info.rank, size_var, info.world_size));
  }
  if (info.local_rank >= info.local_world_size) {
    throw InputError(fmt::format("environment variable {}={} must be less than {}={}",
                                 local_rank_var, info.local_rank, local_size_var,
                                 info.local_world_size));
  }
}

}  // namespace

const char* to_string(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kEnv:
      return "env";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSlurm:
      return "slurm";
  }
  return "?";
}

Env current_env() {
  Env env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

LaunchInfo detect_launch(const Env& env) {
  LaunchInfo info;
  if (find(env, "RANK") != nullptr || find(env, "WORLD_SIZE") != nullptr) {
    info.launcher = Launcher::kEnv;
    info.world_size =
        require_env_int(env, "WORLD_SIZE", 1, "RANK is set: the env contract needs both");
    info.rank = require_env_int(env, "RANK", 0, "WORLD_SIZE is set: the env contract needs both");
    info.local_rank = env_int_or(env, "LOCAL_RANK", 0, 0);
    info.local_world_size = env_int_or(env, "LOCAL_WORLD_SIZE", 1, 1);
    check_ranks(info, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    read_master(env, info, info.world_size > 1, "the env contract (RANK, WORLD_SIZE)");
  } else if (find(env, "OMPI_COMM_WORLD_RANK") != nullptr) {
    info.launcher = Launcher::kMpirun;
    info.rank = parse_env_int(env, "OMPI_COMM_WORLD_RANK", 0);
    info.world_size = require_env_int(env, "OMPI_COMM_WORLD_SIZE", 1, "set by mpirun");
    info.local_rank = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    info.local_world_size = env_int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1);
    check_ranks(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE");
    read_master(env, info, /*required=*/false, "mpirun");  // only the gloo backend needs them
  } else if (find(env, "SLURM_PROCID") != nullptr && find(env, "SLURM_NTASKS") != nullptr) {
    info.launcher = Launcher::kSlurm;
    info.rank = parse_env_int(env, "SLURM_PROCID", 0);
    info.world_size = parse_env_int(env, "SLURM_NTASKS", 1);
    info.local_rank = env_int_or(env, "SLURM_LOCALID", 0, 0);
    if (find(env, "SLURM_NTASKS_PER_NODE") != nullptr) {
      info.local_world_size = parse_env_int(env, "SLURM_NTASKS_PER_NODE", 1);
    } else if (const auto* per_node = find(env, "SLURM_STEP_TASKS_PER_NODE"); per_node != nullptr) {
      info.local_world_size = std::max(1, leading_int(*per_node));
    } else {
      info.local_world_size = info.world_size;
    }
    check_ranks(info, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
    derive_slurm_master(env, info);
    read_master(env, info, info.world_size > 1 && info.master_addr.empty(), "srun");
    if (info.world_size > 1 && info.master_port == 0) {
      throw InputError(
          "environment variable MASTER_PORT is not set, and there is no SLURM_JOB_ID to derive "
          "it from (srun with SLURM_NTASKS > 1 needs MASTER_ADDR and MASTER_PORT for the "
          "rendezvous store)");
    }
  }
  if (const auto* token = find(env, "DDP_JOB_TOKEN")) info.job_token = *token;
  if (const auto* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE")) {
    info.agent_store = *agent == "True" || *agent == "true" || *agent == "1";
  }
  info.restart_count = env_int_or(env, "TORCHELASTIC_RESTART_COUNT", 0, 0);
  return info;
}

std::string first_slurm_host(const std::string& nodelist) {
  // "a[01-04,07]-ib[1-2],b5": the first name is a with each bracket's first number, "a01-ib1".
  std::string host;
  for (size_t i = 0; i < nodelist.size() && nodelist[i] != ','; ++i) {
    if (nodelist[i] != '[') {
      host += nodelist[i];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw InputError("SLURM node list '" + nodelist + "': no ']'");
    const std::string range = nodelist.substr(i + 1, close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close;
  }
  if (host.empty()) throw InputError("SLURM node list '" + nodelist + "': no host");
  return host;
}

int slurm_port(const std::string& job_id) {
  const std::string digits = job_id.substr(job_id.size() > 4 ? job_id.size() - 4 : 0);
  int last = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), last);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    throw InputError(fmt::format(
        "environment variable SLURM_JOB_ID='{}': expected a number (to derive MASTER_PORT)",
        job_id));
  }
  return 15000 + last;
}

std::string host_key(const std::string& host_name, const Env& env) {
  const auto node = env.find("GROUP_RANK");
  return node == env.end() ? host_name : host_name + "/node " + node->second;
}

std::string default_backend(const LaunchInfo& launch, bool cuda_device) {
  if (cuda_device) return "nccl";
  if (launch.world_size == 1) return "local";
  // Under mpirun shared memory over the mpi group where every rank is on this host (faster than
  // Open MPI's own there: docs/benchmarks.md); across hosts mpi itself, as shm would be anyway.
  const bool across_hosts = launch.local_world_size != launch.world_size;
  if (launch.launcher == Launcher::kMpirun && across_hosts) return "mpi";
  return "shm";
}

}  // namespace ddp::comm
