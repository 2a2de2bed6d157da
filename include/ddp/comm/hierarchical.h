#pragma once
// Hierarchical all-reduce, for ranks on several hosts joined by a link slower than the hosts'
// insides (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, in three steps of the existing backends):
//
//   1. reduce_scatter within each host: local rank i holds block i of its host's sum;
//   2. all_reduce of block i across hosts, among the ranks of local rank i (one per host);
//   3. all_gather within each host: every rank holds every block of the global sum.
//
// A flat ring all-reduce sends each byte across the slow link once per rank of a host; this,
// once per host (each of a host's L ranks carries 1/L of it). Results equal the flat all-reduce's
// to float rounding (the sums are taken in another order), exactly where the values are integers.

#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::comm {

// The ranks of each host, `hosts[r]` naming rank r's host: hosts in the order of their lowest
// rank, each host's ranks ascending. A pure function.
std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& hosts);

// Why the hierarchy cannot serve `by_host` (ranks_by_host's), or "" when it can: it needs more
// than one host, and the same number of ranks on each (step 2 pairs local rank i of every host).
// A pure function.
std::string hierarchy_unusable_because(const std::vector<std::vector<int>>& by_host);

// The two levels of a topology of several hosts with as many ranks on each: this rank's host's
// ranks, and the ranks of its local rank, one per host (the group step 2 above all-reduces in).
struct HostGroups {
  std::shared_ptr<ProcessGroup> host;
  std::shared_ptr<ProcessGroup> across;
};

// `group`'s HostGroups, `hosts[r]` naming rank r's host (every rank passes the same list): those
// hierarchical() made for its all-reduce where `group` is one it returned, else new ones (a
// collective of `group`: every rank makes every group, in one order). Throws InputError with
// hierarchy_unusable_because's reason.
HostGroups host_groups(const std::shared_ptr<ProcessGroup>& group,
                       const std::vector<std::string>& hosts);

// `inner` whose all_reduce goes through the three steps above; its other collectives, and its
// subgroups, are inner's own. `hosts[r]` names rank r's host (every rank passes the same list).
// A collective of `inner` (it makes the hosts' and the cross-host groups with new_group); throws
// InputError with hierarchy_unusable_because's reason. The steps run on a thread of the group's
// own, in the order of the all_reduce calls, so that an all_reduce issued from a backward hook
// overlaps the rest of backward as a flat one does.
std::shared_ptr<ProcessGroup> hierarchical(std::shared_ptr<ProcessGroup> inner,
                                           const std::vector<std::string>& hosts);

}  // namespace ddp::comm
