#pragma once
// Private: the rendezvous store of the env contract and Slurm, c10d's TCPStore at
// MASTER_ADDR:MASTER_PORT with rank 0 as its server.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "ddp/comm/rendezvous.h"

namespace ddp::comm {

// Describes the rendezvous of `launch` for a CommError.
CollectiveInfo rendezvous_info(const LaunchInfo& launch);

// Rank 0 serves, the others connect; returns once all world_size ranks have connected.
// Throws InputError when rank 0 finds the port in use, CommError when the others do not
// arrive within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout);

}  // namespace ddp::comm
