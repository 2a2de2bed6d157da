// The rendezvous over the job's store (job_store.h): rank 0 serves, every rank joins a barrier
// that names the ranks that never arrive; or torchrun's agent store.
#include "job_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/common/socket.h"
#include "torch_compat.h"

namespace ddp::comm {

using std::chrono::milliseconds;

bool store_listens_on_master_addr_only(const LaunchInfo& launch) {
  return launch.local_world_size == launch.world_size;
}

CollectiveInfo rendezvous_info(const LaunchInfo& launch) {
  return forming_info("rendezvous", launch.rank, launch.world_size);
}

namespace {

const std::string kArrivedPrefix = "ddp/rendezvous/arrived/";
const std::string kCountKey = "ddp/rendezvous/count";
const std::string kCompleteKey = "ddp/rendezvous/complete";

// A client of torchrun's agent store, under the prefix torch.distributed uses for it (one per
// restart, so a restarted group never reads its predecessor's keys).
c10::intrusive_ptr<c10d::Store> connect_agent_store(const LaunchInfo& launch,
                                                    milliseconds timeout) {
  c10d::TCPStoreOptions opts;  // set by name only: 2.x adds fields and reorders them
  opts.port = static_cast<std::uint16_t>(launch.master_port);
  opts.isServer = false;
  opts.numWorkers = static_cast<std::size_t>(launch.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  compat::use_classic_tcp_store(opts);
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
    return c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", launch.restart_count), store);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw CommError(rendezvous_info(launch),
                    fmt::format("rank {}: torchrun's agent store at {}:{} (TORCHELASTIC_USE_AGENT_"
                                "STORE) cannot be reached within {} s: {}",
                                launch.rank, launch.master_addr, launch.master_port,
                                std::chrono::duration<double>(timeout).count(),
                                what.substr(0, what.find('\n'))));
  }
}

// Rank 0's server: on MASTER_ADDR only when every rank is on this host, else on every interface.
std::shared_ptr<StoreServer> serve_store(const LaunchInfo& launch) {
  const std::string address =
      store_listens_on_master_addr_only(launch) ? launch.master_addr : std::string();
  std::shared_ptr<StoreServer> server;
  try {
    server = std::make_shared<StoreServer>(address, launch.master_port, launch.job_token);
  } catch (const net::AddressInUseError&) {
    throw InputError(fmt::format(
        "rank 0: MASTER_PORT {} is already in use on {}: pick a free port (or let the launcher "
        "pick one)",
        launch.master_port, address.empty() ? "this host" : address));
  }
  log::debug("rendezvous store: listening on {}:{}{}", server->listen_address(), server->port(),
             launch.job_token.empty() ? " (no job token: open to any client)" : "");
  return server;
}

// The CommError of a rendezvous that did not complete.
CommError rendezvous_failed(const LaunchInfo& launch, milliseconds timeout,
                            const std::string& what) {
  return CommError(
      rendezvous_info(launch),
      fmt::format("rank {}: rendezvous at MASTER_ADDR:MASTER_PORT = {}:{} did not "
                  "complete within {} s (world size {}): {}",
                  launch.rank, launch.master_addr, launch.master_port,
                  std::chrono::duration<double>(timeout).count(), launch.world_size, what));
}

// The barrier: every rank marks its arrival; the last to arrive says so; all wait for that. A
// rank that never arrives is named.
void join_barrier(StoreClient& client, const LaunchInfo& launch, milliseconds timeout) {
  try {
    client.set(kArrivedPrefix + std::to_string(launch.rank), {});
    if (client.add(kCountKey, 1) == launch.world_size) client.set(kCompleteKey, {});
    client.wait({kCompleteKey}, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < launch.world_size; ++r) {
        if (!client.check({kArrivedPrefix + std::to_string(r)})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      throw rendezvous_failed(launch, timeout, e.what());
    }
    throw rendezvous_failed(launch, timeout,
                            fmt::format("rank(s) {} did not arrive", fmt::join(missing, ", ")));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch, milliseconds timeout) {
  if (launch.agent_store) return connect_agent_store(launch, timeout);
  std::shared_ptr<StoreServer> server;
  if (launch.rank == 0) server = serve_store(launch);
  c10::intrusive_ptr<StoreClient> client;
  try {
    client = c10::make_intrusive<StoreClient>(launch.master_addr, launch.master_port,
                                              launch.job_token, timeout);
  } catch (const InputError&) {
    throw;  // refused: the message says why
  } catch (const std::exception& e) {
    throw rendezvous_failed(launch, timeout, e.what());
  }
  client->own(server);
  join_barrier(*client, launch, timeout);
  return client;
}

}  // namespace ddp::comm
