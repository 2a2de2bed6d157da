// Hierarchical all-reduce's layout logic (comm/hierarchical.h) as pure functions: which ranks
// share a host, and when the hierarchy cannot serve a layout. The all-reduce itself, against the
// flat one with real ranks: HierarchicalAllReduce in tests/integration/test_comm.cpp.
#include <gtest/gtest.h>

#include "ddp/comm/hierarchical.h"
#include "ddp/comm/launch_info.h"
#include "ddp/common/error.h"
#include "ddp/train/distributed.h"

namespace {

using ddp::comm::hierarchy_unusable_because;
using ddp::comm::ranks_by_host;

TEST(Hierarchy, RanksAreGroupedByHostInTheOrderOfTheirLowestRank) {
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(ranks_by_host({"a", "a", "b", "b"}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(ranks_by_host({"b", "a", "c", "a", "b", "c"}), (Groups{{0, 4}, {1, 3}, {2, 5}}));
  EXPECT_EQ(ranks_by_host({"x"}), (Groups{{0}}));
  EXPECT_EQ(ranks_by_host({}), Groups{});
}

TEST(Hierarchy, NeedsSeveralHostsWithAsManyRanksEach) {
  EXPECT_EQ(hierarchy_unusable_because(ranks_by_host({"a", "a", "b", "b"})), "");
  EXPECT_EQ(hierarchy_unusable_because(ranks_by_host({"a", "b"})), "");  // one rank a host
  EXPECT_EQ(hierarchy_unusable_because(ranks_by_host({"a", "a"})), "all ranks are on one host");
  EXPECT_EQ(hierarchy_unusable_because(ranks_by_host({"a", "a", "b"})),
            "the hosts have different numbers of ranks (rank 0's host 2, rank 2's 1)");
}

// ddp_train's --hierarchical: auto turns it on only where it helps (several hosts, several ranks
// on each); true insists, and says why it cannot; false never.
TEST(Hierarchy, TheTrainersSettingDecides) {
  using ddp::train::hierarchy_decision;
  const std::vector<std::string> two_by_two = {"a", "a", "b", "b"};
  EXPECT_EQ(hierarchy_decision("auto", two_by_two),
            "hierarchical all-reduce: 2 hosts of 2 rank(s): within each host, then across hosts");
  EXPECT_EQ(hierarchy_decision("false", two_by_two), "");
  EXPECT_EQ(hierarchy_decision("auto", {"a", "a"}), "");
  EXPECT_EQ(hierarchy_decision("auto", {"a", "b"}), "");  // one rank a host: nothing to gain
  EXPECT_NE(hierarchy_decision("true", {"a", "b"}), "");
  EXPECT_EQ(hierarchy_decision("auto", {"a", "a", "b"}), "");
  try {
    hierarchy_decision("true", {"a", "a"});
    FAIL() << "accepted";
  } catch (const ddp::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "key 'hierarchical': true, but all ranks are on one host");
  }
}

TEST(Hierarchy, ANodeTheLauncherNamesIsAHostOfItsOwn) {
  EXPECT_EQ(ddp::comm::host_key("vm", {}), "vm");
  EXPECT_EQ(ddp::comm::host_key("vm", {{"GROUP_RANK", "1"}}), "vm/node 1");
}

}  // namespace
