#include "ddp/comm/rendezvous.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "backends/backends.h"
#include "ddp/comm/diagnostics/collective_check.h"
#include "store/job_store.h"

namespace ddp::comm {

std::vector<std::string> compiled_backends() {
  // One list made at once: GCC 14 reports a false -Warray-bounds inside std::string for a vector
  // of one string that push_back grows.
  static constexpr const char* kCompiled[] = {
      "local",
#ifdef DDP_HAVE_GLOO
      "gloo",
      "shm",  // over gloo
#endif
#ifdef DDP_HAVE_MPI
      "mpi",
#endif
#ifdef DDP_HAVE_NCCL
      "nccl",
#endif
  };
  return {std::begin(kCompiled), std::end(kCompiled)};
}

std::vector<CudaDevice> list_cuda_devices() {
#ifdef DDP_HAVE_NCCL
  return cuda_runtime_devices();
#else
  return {};
#endif
}

namespace {

#ifdef DDP_HAVE_MPI
constexpr bool kHaveMpi = true;
#else
constexpr bool kHaveMpi = false;
#endif

// NCCL shares its id over MPI under mpirun when MPI is compiled in, else over the store.
bool nccl_over_mpi(const LaunchInfo& launch) {
  return kHaveMpi && launch.launcher == Launcher::kMpirun;
}

bool needs_store(const std::string& backend, const LaunchInfo& launch) {
  return backend == "gloo" || (backend == "shm" && launch.launcher != Launcher::kMpirun) ||
         (backend == "nccl" && launch.world_size > 1 && !nccl_over_mpi(launch));
}

void check_compiled(const std::string& backend) {
  const auto compiled = compiled_backends();
  if (std::find(compiled.begin(), compiled.end(), backend) != compiled.end()) return;
  const bool known =
      backend == "gloo" || backend == "shm" || backend == "mpi" || backend == "nccl" ||
      backend == "local";
  throw InputError(fmt::format("backend '{}' {} (compiled backends: {})", backend,
                               known ? "was not compiled into this build" : "is unknown",
                               fmt::join(compiled, ", ")));
}

// Throws InputError when `backend` is not compiled in or does not fit the device or the launch.
void check_backend_fits(const std::string& backend, const LaunchInfo& launch, bool cuda_device) {
  if (backend == "nccl" && !cuda_device) {
    throw InputError(
        "backend nccl needs CUDA tensors, but this rank's device is the CPU: use "
        "--backend gloo or mpi on CPU, or --device cuda");
  }
  check_compiled(backend);
  if (backend == "local" && launch.world_size != 1) {
    throw InputError(
        fmt::format("backend local runs world size 1 only, but this launch has world "
                    "size {}",
                    launch.world_size));
  }
  if (backend == "mpi" && launch.launcher != Launcher::kMpirun) {
    throw InputError("backend mpi needs ranks started by mpirun (OMPI_COMM_WORLD_RANK is not set)");
  }
  if (needs_store(backend, launch) && (launch.master_addr.empty() || launch.master_port == 0)) {
    throw InputError(
        fmt::format("backend {} needs MASTER_ADDR and MASTER_PORT for its rendezvous "
                    "(launched by {})",
                    backend, to_string(launch.launcher)));
  }
}

#ifdef DDP_HAVE_NCCL
// How rank 0's NCCL unique id reaches the other ranks: over MPI or the store (nothing to share
// for world size 1).
BroadcastBytes nccl_id_exchange(const LaunchInfo& launch, const ProcessGroupOptions& options) {
  BroadcastBytes exchange = [](const std::string& root_value) { return root_value; };
  if (launch.world_size == 1) return exchange;
#ifdef DDP_HAVE_MPI
  if (nccl_over_mpi(launch)) exchange = mpi_broadcast_bytes;
#endif
  if (needs_store("nccl", launch)) {
    exchange = store_broadcast_bytes(connect_store(launch, options.rendezvous_timeout), launch.rank,
                                     "ddp/nccl_unique_id");
  }
  return exchange;
}
#endif

}  // namespace

BroadcastBytes store_broadcast_bytes(c10::intrusive_ptr<c10d::Store> store, int rank,
                                     std::string key) {
  return [store = std::move(store), rank, key = std::move(key)](const std::string& root_value) {
    if (rank == 0) store->set(key, std::vector<uint8_t>(root_value.begin(), root_value.end()));
    const auto bytes = store->get(key);
    return std::string(bytes.begin(), bytes.end());
  };
}

std::unique_ptr<ProcessGroup> create_process_group(const std::string& backend,
                                                   const LaunchInfo& launch,
                                                   const ProcessGroupOptions& options,
                                                   bool cuda_device) {
  check_backend_fits(backend, launch, cuda_device);
  if (backend == "local") return make_local_process_group(options);
#ifdef DDP_HAVE_GLOO
  if (backend == "gloo") return make_gloo_process_group(launch, options);
  // Under mpirun over MPI (no store there), elsewhere over gloo.
  if (backend == "shm" && launch.launcher != Launcher::kMpirun) {
    return make_shm_process_group(make_gloo_process_group(launch, options), options);
  }
#endif
#ifdef DDP_HAVE_MPI
  if (backend == "mpi" || backend == "shm") {
    std::unique_ptr<ProcessGroup> pg = make_mpi_process_group(options);
    DDP_CHECK(pg->world_size() == launch.world_size && pg->rank() == launch.rank,
              "MPI_COMM_WORLD disagrees with OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE");
#ifdef DDP_HAVE_GLOO
    if (backend == "shm") return make_shm_process_group(std::move(pg), options);
#endif
    return pg;
  }
#endif
#ifdef DDP_HAVE_NCCL
  if (backend == "nccl")
    return make_nccl_process_group(launch, options, nccl_id_exchange(launch, options));
#endif
  throw InputError(fmt::format("backend '{}' cannot run this launch", backend));
}

}  // namespace ddp::comm

namespace ddp {

std::shared_ptr<comm::ProcessGroup> init_process_group(const InitProcessGroupOptions& options) {
  const auto env = comm::current_env();
  const auto launch = comm::detect_launch(env);
  const auto debug = comm::debug_level(env);  // a bad value fails before the rendezvous
  const std::string backend = options.backend().empty()
                                  ? comm::default_backend(launch, options.cuda_device())
                                  : options.backend();
  comm::ProcessGroupOptions group_options;
  group_options.timeout = options.timeout();
  group_options.rendezvous_timeout = options.rendezvous_timeout();
  std::shared_ptr<comm::ProcessGroup> group =
      comm::create_process_group(backend, launch, group_options, options.cuda_device());
  if (debug == comm::DebugLevel::kDetail) return comm::check_collectives(group);
  return group;
}

}  // namespace ddp
