#pragma once
// The process-group interface every backend implements (gloo, mpi, nccl, local), on ATen tensors.
//
// Note [Collective order is identical on all ranks]
// Every rank must issue the same collectives in the same order with tensors of the same size
// and dtype. Each call gets the next sequence number; ranks that disagree are a bug in the caller
// (never put a collective inside `if (rank == 0)`), and surface as a timeout naming the
// operation and its sequence number instead of a silent hang.

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/flight_recorder.h"
#include "ddp/common/error.h"

namespace ddp::comm {

enum class ReduceOp { kSum, kAvg, kMin, kMax };
const char* to_string(ReduceOp op);
// PyTorch's name of a dtype: "float32", "int64", ...
std::string dtype_name(c10::ScalarType type);

// What a failed collective was: carried by CommError and written into its message.
struct CollectiveInfo {
  std::string op;     // "all_reduce(sum)", "broadcast(root 0)", ...
  uint64_t seq = 0;   // 1-based sequence number of the collective on this process group
  int64_t numel = 0;  // elements of the (input) tensor
  std::string dtype;  // "float32", ...
  int rank = 0;
  int world_size = 1;
};

// What a failure while a group forms (no collective, no tensor) is reported as: "rendezvous",
// "init(ncclCommInitRank)", ...
CollectiveInfo forming_info(std::string op, int rank, int world_size);

// Turns an all-reduce sum into kAvg's average in place, for backends without a native average:
// divides by world_size, with truncation for integer tensors (the contract of all_reduce).
void sum_to_average(at::Tensor& sum, int world_size);

// "rank r: op #seq failed on backend B: why" (the first line of `why`).
std::string failure_message(const CollectiveInfo& info, const std::string& backend,
                            const std::string& why);

// A collective that failed or timed out. Its message names the rank, the operation, its
// sequence number, the tensor size and which ranks were expected.
class CommError : public Error {
 public:
  CommError(CollectiveInfo info, const std::string& what);
  const CollectiveInfo& info() const { return info_; }

 private:
  CollectiveInfo info_;
};

// An asynchronous collective. Not thread-safe: wait on the thread that issued it.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is done and its result is in the tensor(s) given to the call.
  // Throws CommError on failure or when the process group's timeout passes.
  virtual void wait() = 0;
  // True once done (or failed); never blocks.
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(600);  // per collective
  // How long ranks wait for each other to arrive at the rendezvous (store, communicators).
  std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(300);
};

class ProcessGroup {
 public:
  ProcessGroup(int rank, int world_size, ProcessGroupOptions options);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const ProcessGroupOptions& options() const { return options_; }
  virtual std::string backend_name() const = 0;

  // In place: afterwards every rank's `tensor` holds the reduction over ranks (kAvg: the sum
  // divided by world_size; integer tensors divide with truncation). `tensor` must be contiguous.
  // float16 and bfloat16 travel as 16-bit values on gloo and mpi and are combined in float32.
  // mpi (and gloo for float16) rounds back to 16 bits after each combination of two ranks'
  // values, in an order of its choosing. On gloo, bfloat16 (and a dtype gloo cannot reduce, such
  // as int16) is reduced as a reduce_scatter then an all_gather of the reduced blocks, summed in
  // float32 and rounded once; its all_gather is issued when the Work is waited on or, at the
  // latest, when the group's next collective is issued (never by is_completed(), which stays
  // false until then).
  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Data movement (broadcast, all_gather, all_to_all) takes every dtype on gloo and mpi (bool,
  // int16, float16, bfloat16, ...: bytes on the wire); nccl takes the dtypes NCCL has.
  // In place: afterwards every rank's `tensor` equals `root`'s.
  WorkPtr broadcast(at::Tensor& tensor, int root = 0);
  // `output` is [world_size * input.numel()] of input's dtype: rank r's input at offset
  // r * input.numel(), flattened. Both contiguous.
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input);
  // `input` holds world_size equal blocks (input.numel() == world_size * output.numel(), same
  // dtype, both contiguous); afterwards rank r's `output` is the reduction over ranks of block r
  // (kAvg as all_reduce's). As torch.distributed.reduce_scatter_tensor.
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::kSum);
  // Equal blocks as reduce_scatter (output.numel() == input.numel()): block q of the input goes to
  // rank q, block q of the output came from rank q. As all_to_all_single with equal splits.
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input);
  // Completes once every rank has entered it.
  WorkPtr barrier();

  // A group of some of this group's ranks, as torch.distributed.new_group. A collective of this
  // group: every rank of it calls new_group, with the same `ranks`, in the same order relative to
  // its other collectives and new_group calls (see Note [Collective order is identical on all
  // ranks]); it blocks until the ranks it needs have joined it. `ranks` are ranks of this group,
  // distinct, in any order: they are sorted (as PyTorch does), and a member's rank in the new group
  // is its position in the sorted list. Members get the new group, the other ranks nullptr.
  // Throws InputError naming a rank that is out of range or repeated (before any communication).
  // The subgroup has its own sequence numbers, flight recorder and progress board (where the
  // backend has one), and this group's options (timeouts). It may outlive this group.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);

  // A zero-filled buffer of `numel` elements for this group's collectives (DDP's buckets). A
  // collective: every rank calls it with the same `numel` and `options`, in the same order
  // relative to its other collectives. A backend whose ranks can address each other's memory
  // places it there (shm: one segment that every rank maps), and its all-reduce of the buffer,
  // or of any contiguous part of it, then reads and writes the ranks' copies in place. Otherwise
  // (other backends and devices, a dtype the backend does not reduce, no room): at::zeros. Either
  // way it is an ordinary tensor to everything else. A group that wraps another (a decorator)
  // hands it to the inner group, as it does its collectives: on some ranks a collective of the
  // inner group's and on others none would leave the ranks waiting in different calls.
  at::Tensor allocate_buffer(int64_t numel, const at::TensorOptions& options);

  // Sequence number of the last collective issued (0 before the first).
  uint64_t last_seq() const { return seq_; }
  // Bytes handed to collectives so far: the input tensor's bytes of each (the payload, not what
  // the backend's algorithm moves: a ring all-reduce sends about twice that). For benchmarks and
  // the reducer's per-bucket statistics.
  int64_t bytes_issued() const { return bytes_issued_; }
  // Seconds spent blocked in this group's collectives so far: in the calls that issue them and
  // in their Works' wait(). What a rank waited for the others (straggler.h); is_completed() polls
  // count nothing.
  double blocked_seconds() const { return static_cast<double>(blocked_->load()) * 1e-9; }

  // The flight recorder, and the phase of the training step the next collectives belong to
  // ("forward", "backward: bucket 2", "evaluation", ...). Virtual for groups that wrap another
  // (a decorator that acts where a phase begins: the tests' fault injection); a few calls per
  // step, never per collective.
  const FlightRecorder& recorder() const { return *recorder_; }
  virtual void set_phase(std::string phase) { recorder_->set_phase(std::move(phase)); }
  // The straggler attribution's last verdict, kept by the flight recorder (see there).
  void set_straggler(std::string verdict) { recorder_->set_straggler(std::move(verdict)); }

  // How far every rank is, where the backend shares a store (gloo): each rank's watchdog
  // (watchdog.h) publishes its last issued sequence number; the stall warning reads them all.
  class ProgressBoard {
   public:
    virtual ~ProgressBoard() = default;
    virtual void publish(int rank, uint64_t seq) = 0;
    // Each rank's last published sequence number (0 for one that has not published).
    virtual std::vector<uint64_t> read(int world_size) = 0;
  };
  // This group's board; null where the backend has none (the stall warning then cannot say who
  // lags). Set once by the backend's constructor, used by the watchdog thread only.
  const std::shared_ptr<ProgressBoard>& progress_board() const { return board_; }

 protected:
  // Called by a backend's constructor.
  void set_progress_board(std::shared_ptr<ProgressBoard> board) { board_ = std::move(board); }
  // For a group that wraps `inner` and hands it every collective (a decorator): number on from
  // where `inner` stands, so that both give each collective the same sequence number (the one in
  // the backend's errors), and report progress on its board. Call in the constructor.
  void wrap(const ProcessGroup& inner) {
    seq_ = inner.last_seq();
    board_ = inner.progress_board();
  }

  // Backends implement these; `info` describes the call for error messages.
  virtual WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) = 0;
  virtual WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) = 0;
  virtual WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                                const CollectiveInfo& info) = 0;
  virtual WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                    const CollectiveInfo& info) = 0;
  virtual WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                                const CollectiveInfo& info) = 0;
  virtual WorkPtr do_barrier(const CollectiveInfo& info) = 0;
  // at::zeros, for the backends without buffers of their own.
  virtual at::Tensor do_allocate_buffer(int64_t numel, const at::TensorOptions& options);
  // `ranks` are valid and sorted; returns nullptr where this rank is not among them.
  virtual std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                                     const CollectiveInfo& info) = 0;

  // Tells the flight recorder when the backend's thread completed collective `seq` (callable
  // from any thread, after the group is gone too).
  std::function<void()> arrival_marker(uint64_t seq) const {
    return [recorder = std::weak_ptr<FlightRecorder>(recorder_), seq] {
      if (auto r = recorder.lock()) r->arrived(seq);
    };
  }

  // The message of a timeout of `info` after the group's timeout, naming the expected ranks.
  std::string timeout_message(const CollectiveInfo& info) const;

 private:
  CollectiveInfo next_info(std::string op, const at::Tensor* tensor);
  // The Work that `issue` returns, recorded as done or failed once waited on (next_info recorded
  // it as issued).
  template <class Issue>
  WorkPtr recorded(const CollectiveInfo& info, Issue issue);

  int rank_;
  int world_size_;
  ProcessGroupOptions options_;
  uint64_t seq_ = 0;
  int64_t bytes_issued_ = 0;
  // Nanoseconds of blocked_seconds(), shared with the Works (which may outlive the group).
  std::shared_ptr<std::atomic<int64_t>> blocked_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<FlightRecorder> recorder_ = std::make_shared<FlightRecorder>();
  std::shared_ptr<ProgressBoard> board_;
};

// The stall warning's text (the Watchdog's, watchdog.h): "rank 0: all_reduce(sum) #58 (backward:
// bucket 1) has waited 61 s for the other ranks; not entered by rank(s) 1 (at #57)". `progress`
// holds each rank's last issued sequence number (empty: unknown). A pure function.
std::string stall_message(int rank, const CollectiveRecord& stalled, double waited_s,
                          const std::vector<uint64_t>& progress);

// A Work that is already complete (the local backend, empty collectives).
class CompletedWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

}  // namespace ddp::comm
