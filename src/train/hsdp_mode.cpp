#include "hsdp_mode.h"

#include "ddp/comm/hierarchical.h"
#include "ddp/common/log.h"

namespace ddp::train {

HsdpMode::Groups HsdpMode::groups() const {
  const Distributed& dist = run_.dist;
  const auto by_host = comm::ranks_by_host(dist.hosts);
  if (by_host.size() == 1) {
    log::info("hybrid sharding: one host of {} rank(s): sharded over them, no replicas",
              dist.world_size());
    return {dist.group, nullptr};
  }
  const comm::HostGroups groups = comm::host_groups(dist.group, dist.hosts);
  log::info("hybrid sharding: {} hosts of {} rank(s): sharded within each host, replicated across",
            by_host.size(), by_host.front().size());
  return {groups.host, groups.across};
}

}  // namespace ddp::train
