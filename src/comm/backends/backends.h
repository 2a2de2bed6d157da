#pragma once
// Private: the constructors of the backends, one .cpp each, called by the factory in
// rendezvous.cpp and by the elastic agent for each generation's group (elastic/elastic.cpp). Each
// backend header (gloo/c10d, mpi.h, nccl.h) is included by its .cpp alone.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"

namespace ddp::comm {

// Rank 0's bytes, on every rank: rank 0 passes its value, the others pass anything (ignored).
// Built by the factory on the TCP store or on MPI; used to share the NCCL unique id.
using BroadcastBytes = std::function<std::string(const std::string& root_value)>;
// Through `key` of `store`: rank 0 sets it, every rank gets it (a get waits until it is set).
BroadcastBytes store_broadcast_bytes(c10::intrusive_ptr<c10d::Store> store, int rank,
                                     std::string key);

std::unique_ptr<ProcessGroup> make_local_process_group(const ProcessGroupOptions& options);

#ifdef DDP_HAVE_GLOO
std::unique_ptr<ProcessGroup> make_gloo_process_group(const LaunchInfo& launch,
                                                      const ProcessGroupOptions& options);
// A group of launch.world_size ranks over `store` (an elastic generation's prefix of the
// launcher's store), this one launch.rank; the gloo device as for the job's group.
std::unique_ptr<ProcessGroup> make_gloo_process_group_on(c10::intrusive_ptr<c10d::Store> store,
                                                         const LaunchInfo& launch,
                                                         const ProcessGroupOptions& options);
// The shm backend: `inner` (gloo; mpi under mpirun) whose collectives of CPU tensors go through
// shared memory where every rank of the group is on this host (comm/shm/channel.h); elsewhere,
// and for what shared memory does not serve, inner's. A collective of inner (its ranks agree on a
// segment); a failure to set one up is logged by rank 0 and leaves every rank on inner.
std::unique_ptr<ProcessGroup> make_shm_process_group(std::shared_ptr<ProcessGroup> inner,
                                                     const ProcessGroupOptions& options);
#endif

#ifdef DDP_HAVE_MPI
// Initialises MPI (MPI_THREAD_MULTIPLE) if needed; finalised at exit.
std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);
// MPI_Bcast of rank 0's bytes over MPI_COMM_WORLD (initialising MPI if needed).
std::string mpi_broadcast_bytes(const std::string& root_value);
#endif

#ifdef DDP_HAVE_NCCL
// Tensors on cuda:launch.local_rank (after CUDA_VISIBLE_DEVICES). `exchange` shares the
// ncclUniqueId created by rank 0. An elastic generation's group passes `lost_notice` (whether the
// launcher lost one of its members), which a thread of the group asks every 50 ms: once true, the
// communicator is aborted, so that no member stays in a collective, or in NCCL's init (which is
// then nonblocking, from NCCL 2.14 on), with a dead one.
std::unique_ptr<ProcessGroup> make_nccl_process_group(const LaunchInfo& launch,
                                                      const ProcessGroupOptions& options,
                                                      const BroadcastBytes& exchange,
                                                      std::function<bool()> lost_notice = {});
// The visible devices, from the CUDA runtime (in the same TU: it includes the CUDA headers).
std::vector<CudaDevice> cuda_runtime_devices();
#endif

}  // namespace ddp::comm
