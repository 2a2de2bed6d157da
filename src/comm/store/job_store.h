#pragma once
// Private: the rendezvous store of the env contract and Slurm. Rank 0 serves a key-value store at
// MASTER_ADDR:MASTER_PORT; every rank (rank 0 too) is its client through c10d's Store interface,
// which ProcessGroupGloo and the NCCL id exchange use.
//
// Why not c10d's TCPStore: it accepts any client that reaches the port, and (LibTorch 1.13)
// always listens on every interface. A stray process, or another job that picked the same port,
// could join or corrupt the rendezvous. This store is for the job alone: the launcher gives its
// workers a random DDP_JOB_TOKEN; a connection that does not present it first is refused and
// logged; and on one host the store listens on MASTER_ADDR (loopback under the launcher) only.
// The token is a shared secret against strays and mix-ups, not encryption: it travels in clear.
//
// The parts: store_protocol.h (the wire format, pure functions), store_semantics.h (what each
// request does to the keys, a pure function), store_server.h (rank 0's poll loop and the token
// handshake), store_client.h (c10d::Store over one connection). Here: the rendezvous itself.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"
#include "ddp/comm/store/store_protocol.h"
#include "ddp/comm/store/store_server.h"
#include "store_client.h"

namespace ddp::comm {

// Whether rank 0 listens on MASTER_ADDR's address only (every rank on this host) rather than on
// every interface (ranks on other hosts must reach it).
bool store_listens_on_master_addr_only(const LaunchInfo& launch);

// Describes the rendezvous of `launch` for a CommError.
CollectiveInfo rendezvous_info(const LaunchInfo& launch);

// Rank 0 serves, every rank connects with launch.job_token; returns once all world_size ranks
// have joined. Under torchrun's static rendezvous (launch.agent_store), a client of its agent's
// c10d TCPStore instead. Throws InputError when rank 0 finds the port in use or the server refuses
// the token, CommError naming the ranks that did not join within `timeout`.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout);

}  // namespace ddp::comm
