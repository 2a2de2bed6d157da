#include "ddp/comm/process_group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>

namespace ddp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

void sum_to_average(at::Tensor& sum, int world_size) {
  if (at::isIntegralType(sum.scalar_type(), /*includeBool=*/false)) {
    sum.div_(world_size, "trunc");
  } else {
    sum.div_(world_size);
  }
}

std::string failure_message(const CollectiveInfo& info, const std::string& backend,
                            const std::string& why) {
  return fmt::format("rank {}: {} #{} failed on backend {}: {}", info.rank, info.op, info.seq,
                     backend, why.substr(0, why.find('\n')));
}

CommError::CommError(CollectiveInfo info, const std::string& what)
    : Error(what, kExitFailure), info_(std::move(info)) {}

namespace {

using BlockedNanos = std::shared_ptr<std::atomic<int64_t>>;

// Adds the time from its construction to its destruction to `total`.
class BlockedTimer {
 public:
  explicit BlockedTimer(std::atomic<int64_t>& total) : total_(total) {}
  ~BlockedTimer() {
    total_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start_)
                  .count();
  }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A backend's Work that tells the flight recorder when it is done or failed, and counts the
// time its wait blocked.
class RecordedWork : public Work {
 public:
  RecordedWork(WorkPtr inner, std::shared_ptr<FlightRecorder> recorder, uint64_t seq,
               BlockedNanos blocked)
      : inner_(std::move(inner)),
        recorder_(std::move(recorder)),
        seq_(seq),
        blocked_(std::move(blocked)) {}
  void wait() override {
    try {
      const BlockedTimer timer(*blocked_);
      inner_->wait();
    } catch (...) {
      recorder_->finished(seq_, false);
      throw;
    }
    recorder_->finished(seq_, true);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t seq_;
  BlockedNanos blocked_;
};

}  // namespace

std::string stall_message(int rank, const CollectiveRecord& stalled, double waited_s,
                          const std::vector<uint64_t>& progress) {
  std::string behind;
  for (size_t r = 0; r < progress.size(); ++r) {
    if (progress[r] < stalled.seq) {
      behind += fmt::format("{}{} (at #{})", behind.empty() ? "" : ", ", r, progress[r]);
    }
  }
  std::string who;
  if (progress.empty()) {
    who = "which ranks have not entered it is unknown on this backend (see ddp_train --diagnose)";
  } else if (behind.empty()) {
    who = "every rank has entered it: one may be stuck inside it";
  } else {
    who = "not entered by rank(s) " + behind;
  }
  return fmt::format("rank {}: {} #{} ({}) has waited {:.0f} s for the other ranks; {}", rank,
                     stalled.op, stalled.seq, stalled.phase, waited_s, who);
}

ProcessGroup::ProcessGroup(int rank, int world_size, ProcessGroupOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {}

template <class Issue>
WorkPtr ProcessGroup::recorded(const CollectiveInfo& info, Issue issue) {
  try {
    WorkPtr work;
    {
      const BlockedTimer timer(*blocked_);
      work = issue();
    }
    return std::make_shared<RecordedWork>(std::move(work), recorder_, info.seq, blocked_);
  } catch (...) {
    recorder_->finished(info.seq, false);
    throw;
  }
}

CollectiveInfo forming_info(std::string op, int rank, int world_size) {
  CollectiveInfo info;
  info.op = std::move(op);
  info.rank = rank;
  info.world_size = world_size;
  return info;
}

CollectiveInfo ProcessGroup::next_info(std::string op, const at::Tensor* tensor) {
  CollectiveInfo info;
  info.op = std::move(op);
  info.seq = ++seq_;
  info.rank = rank_;
  info.world_size = world_size_;
  if (tensor != nullptr) {
    info.numel = tensor->numel();
    info.dtype = dtype_name(tensor->scalar_type());
  }
  const auto bytes = tensor == nullptr ? int64_t{0} : static_cast<int64_t>(tensor->nbytes());
  bytes_issued_ += bytes;
  // Recorded as issued before the backend sees it: a backend call that blocks shows as waiting.
  recorder_->issued(info.seq, info.op, bytes);
  return info;
}

std::string ProcessGroup::timeout_message(const CollectiveInfo& info) const {
  return fmt::format(
      "rank {}: {} #{} ({} elements of {}) timed out after {} s on backend {}: expected ranks "
      "0-{} to join it; a rank that crashed, hangs, or issued its collectives in another order "
      "(see Note [Collective order is identical on all ranks]) has not",
      info.rank, info.op, info.seq, info.numel, info.dtype.empty() ? "-" : info.dtype,
      std::chrono::duration<double>(options_.timeout).count(), backend_name(), info.world_size - 1);
}

namespace {
// A caller's mistake, not ddp's: InputError (DDP_CHECK is for ddp's own invariants).
void require(bool condition, const char* what) {
  if (!condition) throw InputError(what);
}
}  // namespace

WorkPtr ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  require(tensor.is_contiguous(), "all_reduce needs a contiguous tensor");
  const auto info = next_info(fmt::format("all_reduce({})", to_string(op)), &tensor);
  return recorded(info, [&] { return do_all_reduce(tensor, op, info); });
}

WorkPtr ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  require(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  require(root >= 0 && root < world_size_, "broadcast root outside the group");
  const auto info = next_info(fmt::format("broadcast(root {})", root), &tensor);
  return recorded(info, [&] { return do_broadcast(tensor, root, info); });
}

WorkPtr ProcessGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  require(output.is_contiguous() && input.is_contiguous(), "all_gather needs contiguous tensors");
  require(
      output.numel() == input.numel() * world_size_ && output.scalar_type() == input.scalar_type(),
      "all_gather output must be world_size * input.numel() of input's dtype");
  const auto info = next_info("all_gather", &input);
  return recorded(info, [&] { return do_all_gather(output, input, info); });
}

namespace {

// The contract of reduce_scatter and all_to_all: contiguous tensors of one dtype, `input` in
// world_size equal blocks, `output` of `output_blocks` of them.
void check_blocks(const std::string& op, const at::Tensor& output, const at::Tensor& input,
                  int world_size, int64_t output_blocks) {
  if (!output.is_contiguous() || !input.is_contiguous()) {
    throw InputError(op + " needs contiguous tensors");
  }
  if (output.scalar_type() != input.scalar_type()) {
    throw InputError(fmt::format("{}: output is {}, input {}: they must have one dtype", op,
                                 dtype_name(output.scalar_type()),
                                 dtype_name(input.scalar_type())));
  }
  if (input.numel() % world_size != 0 ||
      output.numel() * world_size != input.numel() * output_blocks) {
    throw InputError(fmt::format(
        "{}: input has {} elements and output {}: with world size {}, input must be {} equal "
        "blocks and output {} of them",
        op, input.numel(), output.numel(), world_size, world_size, output_blocks));
  }
}

// Sorted `ranks`, or InputError naming the rank that is out of [0, world_size) or repeated.
std::vector<int> checked_group_ranks(std::vector<int> ranks, int world_size) {
  if (ranks.empty()) throw InputError("new_group needs at least one rank");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size) {
      throw InputError(fmt::format("new_group: rank {} is not a rank of this group (ranks 0-{})",
                                   ranks[i], world_size - 1));
    }
    if (i > 0 && ranks[i] == ranks[i - 1]) {
      throw InputError(fmt::format("new_group: rank {} is listed twice", ranks[i]));
    }
  }
  return ranks;
}

}  // namespace

WorkPtr ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_blocks("reduce_scatter", output, input, world_size_, 1);
  const auto info = next_info(fmt::format("reduce_scatter({})", to_string(op)), &input);
  return recorded(info, [&] { return do_reduce_scatter(output, input, op, info); });
}

WorkPtr ProcessGroup::all_to_all(at::Tensor& output, const at::Tensor& input) {
  check_blocks("all_to_all", output, input, world_size_, world_size_);
  const auto info = next_info("all_to_all", &input);
  return recorded(info, [&] { return do_all_to_all(output, input, info); });
}

WorkPtr ProcessGroup::barrier() {
  const auto info = next_info("barrier", nullptr);
  return recorded(info, [&] { return do_barrier(info); });
}

at::Tensor ProcessGroup::allocate_buffer(int64_t numel, const at::TensorOptions& options) {
  DDP_CHECK(numel >= 0, "allocate_buffer of a negative size");
  // Not numbered: the collectives are the user's (the backend's set-up, if any, is its own).
  return do_allocate_buffer(numel, options);
}

at::Tensor ProcessGroup::do_allocate_buffer(int64_t numel, const at::TensorOptions& options) {
  return at::zeros({numel}, options);
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks) {
  ranks = checked_group_ranks(std::move(ranks), world_size_);
  // Recorded as a collective: the backends build the subgroup's communicator collectively.
  const auto info = next_info(fmt::format("new_group(ranks {})", fmt::join(ranks, ",")), nullptr);
  std::shared_ptr<ProcessGroup> group;
  try {
    group = do_new_group(ranks, info);
  } catch (...) {
    recorder_->finished(info.seq, false);
    throw;
  }
  recorder_->finished(info.seq, true);
  const bool member = std::binary_search(ranks.begin(), ranks.end(), rank_);
  DDP_CHECK((group != nullptr) == member, "new_group: the backend disagrees about membership");
  return group;
}

}  // namespace ddp::comm
