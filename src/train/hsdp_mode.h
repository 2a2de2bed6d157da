#pragma once
// parallel hsdp: hybrid sharding, FSDP2's 2-D mesh. FsdpMode with the ranks of each host sharding
// the model and the hosts replicating it (FullyShardOptions::replicate_group): a unit's gradient
// is reduce-scattered in the host, then its shard all-reduced with the same shard on the other
// hosts, in the hierarchical all-reduce's across-hosts group (comm::host_groups). On one host, it
// is fsdp. Its option rules are FsdpMode's, which name it. A private header of the train layer
// (parallel_mode.h).

#include "fsdp_mode.h"

namespace ddp::train {

class HsdpMode : public FsdpMode {
 public:
  using FsdpMode::FsdpMode;

 protected:
  // This host's ranks, and this local rank's on every host (the start-up's topology:
  // Distributed::hosts); a collective where it makes them.
  Groups groups() const override;
};

}  // namespace ddp::train
