// CPU tensors of ranks on one host through shared memory (comm/shm), over a group (gloo; mpi under
// mpirun) that sets it up and serves whatever it does not: ranks on several hosts (where the
// hierarchical group's host level is a shm group again), tensors that are not on the CPU, dtypes
// it does not reduce; new_group's members are shm groups over the inner group's subgroup.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <optional>
#include <random>

#include "backends/backends.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/comm/shm/channel.h"
#include "ddp/comm/shm/segment.h"
#include "ddp/common/log.h"
#include "ddp/common/socket.h"
#include "job_thread.h"

namespace ddp::comm {
namespace {

// The region of one group: a budget that /dev/shm's usual sizes hold (Docker's default is 64 MB,
// shared with a data loader's workers), in slots of up to 4 MiB.
constexpr size_t kRegionBudget = size_t{32} << 20;

std::optional<shm::DType> shm_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return shm::DType::kFloat32;
    case at::kDouble: return shm::DType::kFloat64;
    case at::kHalf: return shm::DType::kFloat16;
    case at::kBFloat16: return shm::DType::kBFloat16;
    case at::kChar: return shm::DType::kInt8;
    case at::kByte: return shm::DType::kUInt8;
    case at::kShort: return shm::DType::kInt16;
    case at::kInt: return shm::DType::kInt32;
    case at::kLong: return shm::DType::kInt64;
    case at::kBool: return shm::DType::kBool;
    default: return std::nullopt;
  }
}

shm::Op shm_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return shm::Op::kMin;
    case ReduceOp::kMax: return shm::Op::kMax;
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return shm::Op::kSum;
  }
  return shm::Op::kSum;
}

// A name no other group on this host has: this process, a count, and randomness against a
// process id that an earlier job on the host (in another pid namespace) had.
std::string segment_name() {
  static std::atomic<int> groups{0};
  std::random_device random;
  return fmt::format("/ddp-{}-{}-{:08x}", ::getpid(), groups++, random());
}

// Removes the segment's name when the set-up ends, however it ends; a name already gone is fine.
struct SegmentName {
  std::string name;
  ~SegmentName() { shm::Segment::remove(name); }
};

// A collective run by the group's thread: wait() and is_completed() read its future.
class ShmWork : public Work {
 public:
  ShmWork(std::shared_future<void> done, CollectiveInfo info, std::string timeout_message)
      : done_(std::move(done)), info_(std::move(info)), timeout_message_(std::move(timeout_message)) {}
  // A timeout reads as every backend's (the group's timeout_message), with the ranks that did
  // not come; any other failure names its rank.
  void wait() override {
    try {
      done_.get();
    } catch (const shm::ChannelError& e) {
      if (e.timed_out()) throw CommError(info_, fmt::format("{} ({})", timeout_message_, e.what()));
      throw CommError(info_, failure_message(info_, "shm", e.what()));
    }
  }
  bool is_completed() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
  CollectiveInfo info_;
  std::string timeout_message_;
};

class ShmProcessGroup : public ProcessGroup {
 public:
  // A collective of `inner`: its ranks agree whether they share a host and a segment.
  ShmProcessGroup(std::shared_ptr<ProcessGroup> inner, const ProcessGroupOptions& options)
      : ProcessGroup(inner->rank(), inner->world_size(), options), inner_(std::move(inner)) {
    wrap(*inner_);
    attach();
  }
  ~ShmProcessGroup() override {
    // This rank leaves the channel: a collective still running here ends, and so does any
    // other rank's wait for it (an elastic member that left its generation alive, as gloo's
    // closed sockets tell the others). A rank that has passed its last round has seen every
    // other rank arrive there, and a wait that finds the channel broken looks at the counters
    // again: the others' last collectives still complete.
    if (channel_) {
      channel_->abort();
      thread_.post([this] { channel_.reset(); });  // after the collectives still queued
    }
    thread_.stop(std::chrono::milliseconds::max());
  }
  std::string backend_name() const override { return channel_ ? "shm" : inner_->backend_name(); }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    const auto type = shm_dtype(tensor.scalar_type());
    if (!serves(tensor) || !type) return inner_->all_reduce(tensor, op);
    return post(info, [this, t = tensor, type = *type, op]() mutable {
      channel_->all_reduce(t.data_ptr(), static_cast<size_t>(t.numel()), type, shm_op(op));
      if (op == ReduceOp::kAvg) sum_to_average(t, world_size());
    });
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    if (!serves(tensor)) return inner_->broadcast(tensor, root);
    return post(info, [this, t = tensor, root] { channel_->broadcast(t.data_ptr(), t.nbytes(), root); });
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    if (!serves(input) || !serves(output)) return inner_->all_gather(output, input);
    return post(info, [this, out = output, in = input] {
      channel_->all_gather(out.data_ptr(), in.data_ptr(), in.nbytes());
    });
  }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    const auto type = shm_dtype(input.scalar_type());
    if (!serves(input) || !serves(output) || !type) {
      return inner_->reduce_scatter(output, input, op);
    }
    return post(info, [this, out = output, in = input, type = *type, op]() mutable {
      channel_->reduce_scatter(out.data_ptr(), in.data_ptr(), static_cast<size_t>(out.numel()),
                               type, shm_op(op));
      if (op == ReduceOp::kAvg) sum_to_average(out, world_size());
    });
  }
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    if (!serves(input) || !serves(output)) return inner_->all_to_all(output, input);
    const auto world = static_cast<size_t>(world_size());
    return post(info, [this, out = output, in = input, world] {
      channel_->all_to_all(out.data_ptr(), in.data_ptr(), in.nbytes() / world);
    });
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    if (!channel_) return inner_->barrier();
    return post(info, [this] { channel_->barrier(); });
  }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& /*info*/) override {
    // The members' group over inner's subgroup: shared memory again where they share a host
    // (the hierarchical all-reduce's host level).
    auto sub = inner_->new_group(ranks);
    if (!sub) return nullptr;
    return std::make_shared<ShmProcessGroup>(std::move(sub), options());
  }

 private:
  bool serves(const at::Tensor& t) const { return channel_ && t.device().is_cpu(); }

  // Runs `job` on the group's thread, in the order of the calls (the same on every rank).
  WorkPtr post(const CollectiveInfo& info, std::function<void()> job) {
    return std::make_shared<ShmWork>(thread_.post(std::move(job)), info, timeout_message(info));
  }

  // Every rank on one host: rank 0 creates the segment, the others map it, every rank unlinks it
  // (Note [Nothing left in /dev/shm]). Where any step fails anywhere, every rank stays on inner,
  // and rank 0 says why.
  void attach();
  // The segment's name, chosen by rank 0, where every rank of the group is on this host.
  std::optional<std::string> segment_name_on_one_host();
  // The last exchange, of each rank's outcome (`mine`: "" or why it failed): where any rank
  // failed, every rank drops its channel and segment.
  void keep_if_all_attached(const std::string& mine);
  void warn_not_used(int rank, const std::string& why) const;
  void make_channel(size_t slot);
  void drop_channel();

  std::shared_ptr<ProcessGroup> inner_;
  std::optional<shm::Segment> segment_;
  std::unique_ptr<shm::Channel> channel_;
  JobThread thread_;  // last: stopped first, before the channel and its memory go
};

void ShmProcessGroup::attach() {
  const c10::Device cpu(c10::kCPU);
  const auto name = segment_name_on_one_host();
  if (!name) return;  // several hosts: inner's (and the hierarchy's host groups)
  const SegmentName remove_at_the_end{*name};
  const size_t slot = shm::Channel::slot_bytes_for(world_size(), kRegionBudget);
  const size_t bytes = shm::Channel::region_bytes(world_size(), slot);
  // Each rank's outcome: "" or why it failed.
  std::string mine;
  const auto step = [&](auto make) {
    try {
      segment_.emplace(make());
    } catch (const Error& e) {
      mine = e.what();
    }
  };
  if (rank() == 0) step([&] { return shm::Segment::create(*name, bytes); });
  if (any_rank(*inner_, !mine.empty(), cpu)) {  // rank 0 could not create it
    if (rank() == 0) warn_not_used(0, mine);
    segment_.reset();
    return;
  }
  if (rank() != 0) step([&] { return shm::Segment::open(*name, bytes); });
  // The channel before the last exchange: a rank lost after it has its life in the segment
  // already, and the others' first collective sees it gone.
  if (segment_) {
    try {
      make_channel(slot);
    } catch (const Error& e) {
      mine = e.what();
    }
  }
  keep_if_all_attached(mine);
}

std::optional<std::string> ShmProcessGroup::segment_name_on_one_host() {
  // Rank 0 names the segment in the first collective, before it exists: every rank knows the
  // name, and removes it however the set-up ends (Note [Nothing left in /dev/shm]).
  const std::string host = host_key(net::host_name(), current_env());
  const auto records = all_gather_bytes(
      *inner_, host + '\n' + (rank() == 0 ? segment_name() : ""), c10::Device(c10::kCPU));
  for (const auto& record : records) {
    if (record.substr(0, record.find('\n')) != host) return std::nullopt;
  }
  return records.front().substr(records.front().find('\n') + 1);
}

void ShmProcessGroup::keep_if_all_attached(const std::string& mine) {
  std::vector<std::string> outcomes;
  try {
    outcomes = all_gather_bytes(*inner_, mine, c10::Device(c10::kCPU));
  } catch (...) {
    drop_channel();
    throw;
  }
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].empty()) continue;
    if (rank() == 0) warn_not_used(static_cast<int>(r), outcomes[r]);
    drop_channel();
    segment_.reset();
    return;
  }
}

// Made and unmade on the group's thread: Note [A rank's life is a robust mutex].
void ShmProcessGroup::make_channel(size_t slot) {
  thread_
      .post([&] {
        channel_ = std::make_unique<shm::Channel>(segment_->data(), rank(), world_size(), slot,
                                                  options().timeout);
      })
      .get();
}

void ShmProcessGroup::drop_channel() {
  if (channel_) thread_.post([this] { channel_.reset(); }).get();
}

void ShmProcessGroup::warn_not_used(int rank, const std::string& why) const {
  log::warn("shared memory: rank {}: {}; collectives go through {}", rank, why,
            inner_->backend_name());
}

}  // namespace

std::unique_ptr<ProcessGroup> make_shm_process_group(std::shared_ptr<ProcessGroup> inner,
                                                     const ProcessGroupOptions& options) {
  return std::make_unique<ShmProcessGroup>(std::move(inner), options);
}

}  // namespace ddp::comm
