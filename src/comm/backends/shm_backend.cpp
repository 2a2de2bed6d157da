// CPU tensors of ranks on one host through shared memory (comm/shm), over a group (gloo; mpi under
// mpirun) that sets it up and serves whatever it does not: ranks on several hosts (where the
// hierarchical group's host level is a shm group again), tensors that are not on the CPU, dtypes
// it does not reduce; new_group's members are shm groups over the inner group's subgroup.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include "backends/backends.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/comm/shm/buffers.h"
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
constexpr size_t kPage = 4096;

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

// The channel divides a floating average as it reduces each block, while the block is in the
// cache (each element once over the ranks, not on every rank); an integer average is a sum the
// caller divides (sum_to_average).
shm::Op shm_op(ReduceOp op, shm::DType type) {
  switch (op) {
    case ReduceOp::kMin: return shm::Op::kMin;
    case ReduceOp::kMax: return shm::Op::kMax;
    case ReduceOp::kSum: return shm::Op::kSum;
    case ReduceOp::kAvg: return shm::averages(type) ? shm::Op::kAvg : shm::Op::kSum;
  }
  return shm::Op::kSum;
}

// The division of an average the channel left to its caller.
void finish_average(at::Tensor& t, ReduceOp op, shm::DType type, int world_size) {
  if (op == ReduceOp::kAvg && !shm::averages(type)) sum_to_average(t, world_size);
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

// A collective posted to the group's thread: wait() runs it on the caller's own thread where the
// group's has not started it and it is next (JobThread::run_if_next: DDP's step waits for its
// last bucket as soon as it is launched), then reads its future, as is_completed() does.
//
// Note [A woken collective does not preempt]
// A collective on shared memory is work for this host's cores: copies and sums, nothing to wait
// for but the other ranks. It can overlap the computation only on a core that would otherwise
// idle; on a busy one it only time-slices with it. At normal priority, each bucket posted woke
// the group's thread, which preempted the computation (the scheduler favours a thread that
// slept), then fought its caller for the queue, and mostly found the job taken by the waiter
// (run_if_next): 5-6 context switches a step on rank 0 for the MLP's one bucket (perf's
// sched_switch, 2 ranks, 2 cores). So the thread is SCHED_BATCH: woken, it never preempts; it
// runs at once on a free core (more cores than ranks, a rank waiting), and on a busy one from
// the next tick or when the caller blocks, by which time the caller's wait() has usually run the
// job itself. About 2.4 switches a step; the launcher's MLP 3% faster in samples/s, 7 interleaved
// rounds against the build before (docs/benchmarks.md). Not SCHED_IDLE, which cut the switches
// further: a thread that runs only on a core nothing else wants also dies only there, and a
// process exits when its last thread has. On a host busy with other work a SIGKILLed rank stayed
// alive for seconds (the launcher named it 9.5 s after the kill, 0.8-1.3 s at normal priority or
// SCHED_BATCH), and so did its robust mutex, by which the others see it gone (Note [A rank's
// life is a robust mutex]). The mpi backend's and the hierarchical group's threads stay at
// normal priority: they wait on a network, whose progress should not wait for a turn.
class ShmWork : public Work {
 public:
  ShmWork(const std::shared_ptr<JobThread>& thread, JobThread::Ticket ticket, CollectiveInfo info,
          std::string timeout_message)
      : thread_(thread),
        done_(std::move(ticket.done)),
        number_(ticket.number),
        info_(std::move(info)),
        timeout_message_(std::move(timeout_message)) {}
  // A timeout reads as every backend's (the group's timeout_message), with the ranks that did
  // not come; any other failure names its rank.
  void wait() override {
    if (auto thread = thread_.lock()) thread->run_if_next(number_);  // the group may be gone
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
  std::weak_ptr<JobThread> thread_;
  std::shared_future<void> done_;
  uint64_t number_;
  CollectiveInfo info_;
  std::string timeout_message_;
};

class ShmProcessGroup : public ProcessGroup {
 public:
  // A collective of `inner`: its ranks agree whether they share a host and a segment.
  // `buffers`: those of the groups this one was made from too (do_new_group).
  ShmProcessGroup(std::shared_ptr<ProcessGroup> inner, const ProcessGroupOptions& options,
                  std::optional<shm::GroupBuffers> buffers = std::nullopt)
      : ProcessGroup(inner->rank(), inner->world_size(), options),
        inner_(std::move(inner)),
        buffers_(buffers ? std::move(*buffers) : shm::GroupBuffers(rank(), world_size())) {
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
      thread_->post([this] { channel_.reset(); });  // after the collectives still queued
    }
    thread_->stop(std::chrono::milliseconds::max());
  }
  std::string backend_name() const override { return channel_ ? "shm" : inner_->backend_name(); }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    const auto type = shm_dtype(tensor.scalar_type());
    if (!serves(tensor) || !type) return inner_->all_reduce(tensor, op);
    if (auto place = in_buffers(tensor)) {
      return post(info, [this, t = tensor, type = *type, op, place = std::move(*place)]() mutable {
        channel_->all_reduce_in_place(place.copies.data(), static_cast<size_t>(t.numel()), type,
                                      shm_op(op, type), place.buffer, place.offset);
        finish_average(t, op, type, world_size());
      });
    }
    return post(info, [this, t = tensor, type = *type, op]() mutable {
      channel_->all_reduce(t.data_ptr(), static_cast<size_t>(t.numel()), type, shm_op(op, type));
      finish_average(t, op, type, world_size());
    });
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    if (!serves(tensor)) return inner_->broadcast(tensor, root);
    return post(info, [this, t = tensor, root] { channel_->broadcast(t.data_ptr(), t.nbytes(), root); });
  }
  // An output in the group's buffers is gathered in place, an input there reduce-scattered in
  // place, where every rank's is (Channel::Place).
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    if (!serves(input) || !serves(output)) return inner_->all_gather(output, input);
    return post(info, [this, out = output, in = input, place = in_buffers(output)] {
      Reached reached(*this, place);
      channel_->all_gather(out.data_ptr(), in.data_ptr(), in.nbytes(), reached.place());
    });
  }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    const auto type = shm_dtype(input.scalar_type());
    if (!serves(input) || !serves(output) || !type) {
      return inner_->reduce_scatter(output, input, op);
    }
    auto place = writable_during(output, input) ? in_buffers(input) : std::nullopt;
    return post(info, [this, out = output, in = input, type = *type, op,
                       place = std::move(place)]() mutable {
      Reached reached(*this, place);
      channel_->reduce_scatter(out.data_ptr(), in.data_ptr(), static_cast<size_t>(out.numel()),
                               type, shm_op(op, type), reached.place());
      finish_average(out, op, type, world_size());
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
  at::Tensor do_allocate_buffer(int64_t numel, const at::TensorOptions& options) override;
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& /*info*/) override {
    // The members' group over inner's subgroup: shared memory again where they share a host
    // (the hierarchical all-reduce's host level).
    auto sub = inner_->new_group(ranks);
    if (!sub) return nullptr;
    return std::make_shared<ShmProcessGroup>(std::move(sub), options(),
                                             buffers_.subgroup(ranks, sub->rank()));
  }

 private:
  bool serves(const at::Tensor& t) const { return channel_ && t.device().is_cpu(); }
  // Whether a reduce-scatter in place of `input` may write `output` while the others read
  // `input`: it lies apart from it, or is this rank's block of it (where FSDP2 puts it).
  bool writable_during(const at::Tensor& output, const at::Tensor& input) const {
    const auto* out = static_cast<const uint8_t*>(output.data_ptr());
    const auto* in = static_cast<const uint8_t*>(input.data_ptr());
    return out == in + static_cast<size_t>(rank()) * output.nbytes() ||
           out + output.nbytes() <= in || out >= in + input.nbytes();
  }

  // Runs `job` on the group's thread (or on its waiter's: ShmWork), in the order of the calls
  // (the same on every rank).
  WorkPtr post(const CollectiveInfo& info, std::function<void()> job) {
    return std::make_shared<ShmWork>(thread_, thread_->post_ticket(std::move(job)), info,
                                     timeout_message(info));
  }

  // Every rank on one host: the segment of the channel (set_up_segment). Where any step fails
  // anywhere, every rank stays on inner, and rank 0 says why.
  void attach();
  // The segment's name, chosen by rank 0, where every rank of the group is on this host.
  std::optional<std::string> segment_name_on_one_host();
  // A segment of `bytes` that every rank maps, named `name` (known to every rank): rank 0
  // creates it, the others map it, `then` runs where it is mapped, and a last exchange of the
  // ranks' outcomes keeps it where all got through. Where any failed, every rank drops it
  // (`undo` where `then` ran), and rank 0 warns why and what follows (`instead`). Every rank
  // removes the name however it ends (Note [Nothing left in /dev/shm]).
  std::optional<shm::Segment> set_up_segment(const std::string& name, size_t bytes,
                                             const std::string& instead,
                                             const std::function<void(shm::Segment&)>& then,
                                             const std::function<void()>& undo);
  void make_channel(shm::Segment& segment, size_t slot);
  void drop_channel();

  using Place = shm::GroupBuffers::Place;
  // Where a contiguous tensor lies whole in the buffers the group reaches.
  std::optional<Place> in_buffers(const at::Tensor& t) const {
    if (!t.is_contiguous()) return std::nullopt;
    return buffers_.find(t.data_ptr(), t.nbytes());
  }
  // An all-gather's or reduce-scatter's Place for the channel (null where this rank's memory is
  // not in the buffers), which finds the other ranks' copies and keeps their buffers mapped until
  // the collective returns.
  class Reached {
   public:
    Reached(const ShmProcessGroup& group, const std::optional<Place>& mine) : group_(group) {
      if (!mine) return;
      place_ = shm::Channel::Place{mine->buffer, mine->offset,
                                   [this](int rank, int buffer, uint64_t offset, size_t bytes) {
                                     return group_.buffers_.copy_of(rank, buffer, offset, bytes,
                                                                    held_);
                                   }};
    }
    Reached(const Reached&) = delete;
    Reached& operator=(const Reached&) = delete;
    const shm::Channel::Place* place() const { return place_ ? &*place_ : nullptr; }

   private:
    const ShmProcessGroup& group_;
    std::optional<shm::Channel::Place> place_;
    std::vector<std::shared_ptr<shm::Segment>> held_;
  };

  std::shared_ptr<ProcessGroup> inner_;
  std::optional<shm::Segment> segment_;
  shm::GroupBuffers buffers_;  // Note [The buffers a group reaches]
  std::unique_ptr<shm::Channel> channel_;
  // Last: stopped first, before the channel and its memory go. Shared with the works, whose
  // wait() may run their collective (a work may outlive its group: it then only waits).
  std::shared_ptr<JobThread> thread_ =
      std::make_shared<JobThread>(JobThread::Wakeup::kWaitsItsTurn);
};

void ShmProcessGroup::attach() {
  const auto name = segment_name_on_one_host();
  if (!name) return;  // several hosts: inner's (and the hierarchy's host groups)
  const size_t slot = shm::Channel::slot_bytes_for(world_size(), kRegionBudget);
  // The channel before the last exchange: a rank lost after it has its life in the segment
  // already, and the others' first collective sees it gone.
  segment_ = set_up_segment(
      *name, shm::Channel::region_bytes(world_size(), slot),
      fmt::format("collectives go through {}", inner_->backend_name()),
      [&](shm::Segment& segment) { make_channel(segment, slot); }, [&] { drop_channel(); });
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

std::optional<shm::Segment> ShmProcessGroup::set_up_segment(
    const std::string& name, size_t bytes, const std::string& instead,
    const std::function<void(shm::Segment&)>& then, const std::function<void()>& undo) {
  const c10::Device cpu(c10::kCPU);
  const SegmentName remove_at_the_end{name};
  std::optional<shm::Segment> segment;
  std::string mine;  // "" or why this rank failed
  const auto step = [&](auto make) {
    try {
      make();
    } catch (const Error& e) {
      mine = e.what();
    }
  };
  if (rank() == 0) step([&] { segment.emplace(shm::Segment::create(name, bytes)); });
  if (any_rank(*inner_, !mine.empty(), cpu)) {  // rank 0 could not create it
    if (rank() == 0) log::warn("shared memory: rank 0: {}; {}", mine, instead);
    return std::nullopt;
  }
  if (rank() != 0) step([&] { segment.emplace(shm::Segment::open(name, bytes)); });
  if (segment) step([&] { then(*segment); });
  std::vector<std::string> outcomes;
  try {
    outcomes = all_gather_bytes(*inner_, mine, cpu);
  } catch (...) {
    undo();
    throw;
  }
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].empty()) continue;
    if (rank() == 0) log::warn("shared memory: rank {}: {}; {}", r, outcomes[r], instead);
    undo();
    return std::nullopt;
  }
  return segment;
}

// Made and unmade on the group's thread: Note [A rank's life is a robust mutex].
void ShmProcessGroup::make_channel(shm::Segment& segment, size_t slot) {
  thread_
      ->post([&] {
        channel_ = std::make_unique<shm::Channel>(segment.data(), rank(), world_size(), slot,
                                                  options().timeout);
      })
      .get();
}

void ShmProcessGroup::drop_channel() {
  if (channel_) thread_->post([this] { channel_.reset(); }).get();
}

at::Tensor ShmProcessGroup::do_allocate_buffer(int64_t numel, const at::TensorOptions& options) {
  const at::ScalarType type = c10::typeMetaToScalarType(options.dtype());
  if (!channel_ || !options.device().is_cpu() || !shm_dtype(type) || numel == 0) {
    return ProcessGroup::do_allocate_buffer(numel, options);
  }
  // Each copy on its own pages: a rank's writes never share a page with another copy's.
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(type);
  const size_t stride = (bytes + kPage - 1) / kPage * kPage;
  const auto names = all_gather_bytes(*inner_, rank() == 0 ? segment_name() : "", c10::Device(c10::kCPU));
  auto segment = set_up_segment(
      names.front(), stride * static_cast<size_t>(world_size()),
      fmt::format("the buffer of {} bytes a rank is ordinary memory, its all-reduces staged", bytes),
      [](shm::Segment&) {}, [] {});
  if (!segment) return ProcessGroup::do_allocate_buffer(numel, options);
  auto mapped = std::make_shared<shm::Segment>(std::move(*segment));
  auto* base = static_cast<uint8_t*>(mapped->data());
  buffers_.add(mapped, stride, bytes);
  return at::from_blob(base + static_cast<size_t>(rank()) * stride, {numel},
                       [mapped](void*) mutable { mapped.reset(); }, options);
}

}  // namespace

std::unique_ptr<ProcessGroup> make_shm_process_group(std::shared_ptr<ProcessGroup> inner,
                                                     const ProcessGroupOptions& options) {
  return std::make_unique<ShmProcessGroup>(std::move(inner), options);
}

}  // namespace ddp::comm
