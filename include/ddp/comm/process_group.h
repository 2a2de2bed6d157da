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
  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // In place: afterwards every rank's `tensor` equals `root`'s.
  WorkPtr broadcast(at::Tensor& tensor, int root = 0);
  // `output` is [world_size * input.numel()] of input's dtype: rank r's input at offset
  // r * input.numel(), flattened. Both contiguous.
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input);
  // Completes once every rank has entered it.
  WorkPtr barrier();

  // Sequence number of the last collective issued (0 before the first).
  uint64_t last_seq() const { return seq_; }

  // The flight recorder, and the phase of the training step the next collectives belong to
  // ("forward", "backward: bucket 2", "evaluation", ...).
  const FlightRecorder& recorder() const { return *recorder_; }
  void set_phase(std::string phase) { recorder_->set_phase(std::move(phase)); }

  // Called on the issuing thread before each collective is recorded and handed to the backend
  // (fault injection in tests; none by default). Set it before issuing collectives.
  using IssueHook = std::function<void(const CollectiveInfo&)>;
  void set_issue_hook(IssueHook hook) { issue_hook_ = std::move(hook); }

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

  // Backends implement these; `info` describes the call for error messages.
  virtual WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) = 0;
  virtual WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) = 0;
  virtual WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                                const CollectiveInfo& info) = 0;
  virtual WorkPtr do_barrier(const CollectiveInfo& info) = 0;

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
  std::shared_ptr<FlightRecorder> recorder_ = std::make_shared<FlightRecorder>();
  std::shared_ptr<ProgressBoard> board_;
  IssueHook issue_hook_;
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
