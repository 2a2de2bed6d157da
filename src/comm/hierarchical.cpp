#include "ddp/comm/hierarchical.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <future>
#include <map>

#include "ddp/common/error.h"
#include "job_thread.h"

namespace ddp::comm {

std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& hosts) {
  std::vector<std::vector<int>> out;
  std::map<std::string, size_t> index;
  for (size_t r = 0; r < hosts.size(); ++r) {
    const auto [it, added] = index.emplace(hosts[r], out.size());
    if (added) out.emplace_back();
    out[it->second].push_back(static_cast<int>(r));
  }
  return out;
}

std::string hierarchy_unusable_because(const std::vector<std::vector<int>>& by_host) {
  if (by_host.size() < 2) return "all ranks are on one host";
  for (const auto& ranks : by_host) {
    if (ranks.size() != by_host.front().size()) {
      return fmt::format(
          "the hosts have different numbers of ranks (rank {}'s host {}, rank {}'s {})",
          by_host.front().front(), by_host.front().size(), ranks.front(), ranks.size());
    }
  }
  return "";
}

namespace {

// A Work that a future completes: the step thread's job.
class FutureWork : public Work {
 public:
  explicit FutureWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }  // rethrows the job's CommError
  bool is_completed() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
};

// The host and across-hosts groups of `group` (a collective of it), as host_groups() says.
HostGroups make_host_groups(ProcessGroup& group, const std::vector<std::string>& hosts,
                            const char* what) {
  if (static_cast<int>(hosts.size()) != group.world_size()) {
    throw InputError(
        fmt::format("{}: {} host names for {} ranks", what, hosts.size(), group.world_size()));
  }
  const auto by_host = ranks_by_host(hosts);
  if (const auto why = hierarchy_unusable_because(by_host); !why.empty()) {
    throw InputError(fmt::format("{}: {}", what, why));
  }
  // Every rank makes every group, in one order (new_group is a collective of `group`).
  HostGroups groups;
  for (const auto& ranks : by_host) {
    if (auto g = group.new_group(ranks)) groups.host = std::move(g);
  }
  for (size_t i = 0; i < by_host.front().size(); ++i) {
    std::vector<int> peers;
    for (const auto& ranks : by_host) peers.push_back(ranks[i]);
    if (auto g = group.new_group(peers)) groups.across = std::move(g);
  }
  return groups;
}

class HierarchicalGroup : public ProcessGroup {
 public:
  HierarchicalGroup(std::shared_ptr<ProcessGroup> inner, const std::vector<std::string>& hosts)
      : ProcessGroup(inner->rank(), inner->world_size(), inner->options()),
        inner_(std::move(inner)) {
    wrap(*inner_);  // numbered as inner before the new_groups below (see CheckedGroup)
    const HostGroups groups = make_host_groups(*inner_, hosts, "hierarchical all-reduce");
    host_ = groups.host;
    across_ = groups.across;
    steps_ = std::make_unique<JobThread>();
  }
  HostGroups groups() const { return {host_, across_}; }
  ~HierarchicalGroup() override { steps_.reset(); }  // its jobs use the groups: they end first

  std::string backend_name() const override { return inner_->backend_name(); }
  void set_phase(std::string phase) override {
    inner_->set_phase(phase);
    ProcessGroup::set_phase(std::move(phase));
  }

 protected:
  WorkPtr do_all_reduce(at::Tensor& t, ReduceOp op, const CollectiveInfo&) override {
    at::Tensor tensor = t;  // shares t's storage: the result lands in the caller's tensor
    return std::make_shared<FutureWork>(
        steps_->post([this, tensor, op] { all_reduce_in_steps(tensor, op); }));
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const CollectiveInfo&) override {
    return inner_->broadcast(t, root);
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const CollectiveInfo&) override {
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                            const CollectiveInfo&) override {
    return inner_->reduce_scatter(out, in, op);
  }
  WorkPtr do_all_to_all(at::Tensor& out, const at::Tensor& in, const CollectiveInfo&) override {
    return inner_->all_to_all(out, in);
  }
  WorkPtr do_barrier(const CollectiveInfo&) override { return inner_->barrier(); }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo&) override {
    return inner_->new_group(ranks);
  }

 private:
  // On the step thread. kAvg: sums all the way, divided once at the end as the flat kAvg does.
  void all_reduce_in_steps(at::Tensor tensor, ReduceOp op) {
    at::Tensor flat = tensor.view({-1});
    const int64_t n = flat.numel();
    if (n == 0) return;
    const int64_t parts = host_->world_size();
    const int64_t block = (n + parts - 1) / parts;
    // reduce_scatter wants equal blocks: the tail is padded (its values are never read back).
    at::Tensor whole =
        block * parts == n ? flat : at::cat({flat, at::zeros({block * parts - n}, flat.options())});
    at::Tensor mine = at::empty({block}, flat.options());
    const ReduceOp step = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    host_->reduce_scatter(mine, whole, step)->wait();
    across_->all_reduce(mine, step)->wait();
    host_->all_gather(whole, mine)->wait();
    if (op == ReduceOp::kAvg) {
      if (at::isFloatingType(whole.scalar_type())) {
        whole.div_(world_size());
      } else {
        whole.div_(world_size(), "trunc");
      }
    }
    if (!whole.is_same(flat)) flat.copy_(whole.narrow(0, 0, n));
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<ProcessGroup> host_;    // this host's ranks
  std::shared_ptr<ProcessGroup> across_;  // the ranks of this local rank, one per host
  std::unique_ptr<JobThread> steps_;      // the steps of each all_reduce, on host_ and across_
};

}  // namespace

HostGroups host_groups(const std::shared_ptr<ProcessGroup>& group,
                       const std::vector<std::string>& hosts) {
  if (const auto* h = dynamic_cast<const HierarchicalGroup*>(group.get())) return h->groups();
  return make_host_groups(*group, hosts, "hybrid sharding");
}

std::shared_ptr<ProcessGroup> hierarchical(std::shared_ptr<ProcessGroup> inner,
                                           const std::vector<std::string>& hosts) {
  return std::make_shared<HierarchicalGroup>(std::move(inner), hosts);
}

}  // namespace ddp::comm
