#include "tcp_store.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ddp/common/error.h"

namespace ddp::comm {

CollectiveInfo rendezvous_info(const LaunchInfo& launch) {
  CollectiveInfo info;
  info.op = "rendezvous";
  info.rank = launch.rank;
  info.world_size = launch.world_size;
  return info;
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;  // set by name only: 2.x adds fields (NOTES.md s.3)
  opts.port = static_cast<std::uint16_t>(launch.master_port);
  opts.isServer = launch.rank == 0;
  opts.numWorkers = static_cast<std::size_t>(launch.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  const std::string where = fmt::format("{}:{}", launch.master_addr, launch.master_port);
  try {
    return c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find("already in use") != std::string::npos ||
        what.find("EADDRINUSE") != std::string::npos) {
      throw InputError(fmt::format(
          "rank {}: MASTER_PORT {} is already in use on {}: pick a free port (or let the launcher "
          "pick one)",
          launch.rank, launch.master_port, launch.master_addr));
    }
    throw CommError(rendezvous_info(launch),
                    fmt::format("rank {}: rendezvous at MASTER_ADDR:MASTER_PORT = {} did not "
                                "complete within {} s (world size {}): {}",
                                launch.rank, where, std::chrono::duration<double>(timeout).count(),
                                launch.world_size, what.substr(0, what.find('\n'))));
  }
}

}  // namespace ddp::comm
