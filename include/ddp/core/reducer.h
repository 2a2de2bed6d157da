#pragma once
// The reducer: all-reduces gradients in buckets while backward still runs.
//
// How an iteration goes (all on the thread that runs backward):
//   1. The first grad-accumulator hook of a backward starts the iteration and queues finalize()
//      as the end-of-backward callback.
//   2. Each hook copies its parameter's accumulated .grad into the parameter's slot of its
//      bucket (with gradient_as_bucket_view, .grad *is* that slot). A bucket whose slots are all
//      filled is ready; ready buckets are launched (the comm hook, comm_hook.h; without one,
//      the all-reduce average) strictly in bucket order, so every rank issues the same collectives
//      in the same order (Note [Collective order is identical on all ranks]).
//   3. finalize() marks unused parameters (find_unused_parameters) or reports them, waits for
//      every bucket's future in bucket order, and writes the averages back into .grad. finalize
//      must run before the optimizer reads .grad; autograd guarantees that by running it before
//      backward() returns.
//   4. After the first synchronised iteration the buckets are rebuilt once from the order in
//      which gradients arrived (rank 0's order, broadcast), as c10d's Reducer::rebuild_buckets
//      and sync_bucket_indices do (torch/csrc/distributed/c10d/reducer.cpp).
// Under no_sync (require_sync false) hooks do nothing: .grad accumulates locally, and the next
// synchronised backward reduces the accumulated sum.
// With static_graph, as c10d's static graph: the first synchronised iteration only counts how
// often each parameter's hook runs (more than once when a block's backward is run again inside
// the backward, as activation checkpointing does) and reduces everything in finalize; from the
// second on, a parameter is ready at its last hook, and finalize is queued when the last bucket
// is launched, on whichever backward (outer or re-entrant) that happens.

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/core/bucketing.h"
#include "ddp/core/comm_hook.h"

namespace ddp::core {

struct ReducerOptions {
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
};

using Clock = std::chrono::steady_clock;

// Timestamps of the last synchronised iteration, for tests and the timeline.
struct IterationStats {
  Clock::time_point first_grad;                  // the first hook of the backward
  Clock::time_point last_grad;                   // the last hook of the backward
  std::vector<Clock::time_point> bucket_launch;  // per bucket, when its collective was issued
  // Per bucket, when its collective was first seen complete: polled at every later hook of the
  // backward, and in finalize before waiting on it (so at most one hook late, or the wait).
  std::vector<Clock::time_point> bucket_done;
  // Per bucket, the bytes its hook handed to collectives (ProcessGroup::bytes_issued), those of
  // continuations included.
  std::vector<int64_t> bucket_bytes;
  Clock::time_point finalize_start;  // the end-of-backward callback began
  Clock::time_point finalize_end;    // all averages are in .grad
  bool communicated = false;         // false: one rank passing gradients through, no collective
};

class Reducer {
 public:
  // `params` are the parameters that require gradients, in registration order, with their
  // names for error messages. The group must outlive the reducer.
  Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Reduces each bucket with `hook` instead of the all-reduce average. Once, before the first
  // backward (as PyTorch); throws Error otherwise.
  void register_comm_hook(CommHookFn hook);

  // false inside no_sync(): backward accumulates locally and reduces nothing.
  void set_require_sync(bool require_sync) { require_sync_ = require_sync; }
  bool require_sync() const { return require_sync_; }

  const std::vector<std::vector<size_t>>& buckets() const { return bucket_indices_; }
  // Re-buckets with another cap (after the first bucket), visiting the parameters in the order
  // the buckets were last assigned in (the gradient-ready order once rebuilt), so that every rank
  // gets the same buckets without communicating: call it on every rank, with the same cap,
  // between backwards. For bucket_cap_mb "auto" (bucket_tuning.h). A comm hook that keeps state
  // per bucket (PowerSGD) would no longer find its buckets: the trainer does not tune with one.
  void set_bucket_cap(size_t bytes);
  // The order the buckets were assigned in (parameter indices) and the slots: what
  // bucket_cap_candidates needs.
  const std::vector<int64_t>& bucket_order() const { return order_; }
  std::vector<TensorSlot> slots() const { return slots_of(params_); }
  bool rebuilt() const { return rebuilt_; }
  const IterationStats& last_iteration() const { return stats_; }
  // Backward passes that reached a parameter so far, no_sync ones included (DDP broadcasts the
  // buffers at the first forward after one).
  int64_t backward_count() const { return backward_count_; }

  // Called by the grad-accumulator hook of parameter `index` (after accumulation).
  void on_grad_ready(size_t index);

  // Join (uneven inputs): the collectives of one synchronised backward, issued by a rank that
  // has no batch left, as if all its gradients were zero: every bucket of zeros through the comm
  // hook in bucket order, the unused-parameter map, the one-time bucket rebuild. Leaves .grad
  // alone. Outside any backward.
  void join_backward();

 private:
  struct Bucket {
    torch::Tensor flat;  // the gradients of its parameters, back to back
    std::vector<size_t> params;
    std::vector<torch::Tensor> views;  // per parameter: its slice of flat, shaped like it
    size_t pending = 0;                // parameters not ready yet in this iteration
    FuturePtr future;                  // the hook's, once launched
  };
  enum class Phase { kIdle, kBackward };

  // The buckets' memory: one buffer of the group per (dtype, device) of the parameters, where
  // the group's all-reduce finds the other ranks' copies (ProcessGroup::allocate_buffer). The
  // buckets are carved from it, again at each re-bucketing.
  struct Arena {
    c10::ScalarType dtype;
    c10::Device device;
    torch::Tensor memory;
    int64_t used;  // elements carved so far (while allocating: elements needed)
  };
  void allocate_arenas();
  torch::Tensor carve(const torch::Tensor& like, int64_t numel);  // zeroed, like's dtype and device

  void assign(std::vector<int64_t> order);  // buckets in this order, with options_'s caps
  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  torch::Tensor& slot(size_t param);  // the parameter's view into its bucket
  void launch(size_t bucket);
  void wait_for(size_t bucket);  // its future's value into flat
  void begin_iteration();        // the one place per-iteration state is reset
  void note_backward();          // counts a backward at its first hook
  bool static_graph_known() const { return !expected_hooks_.empty(); }
  void queue_finalize();
  void mark_ready(size_t index);
  void launch_ready_buckets();
  void note_completed();  // stats_.bucket_done of the launched buckets that have completed
  void finalize();
  // The bucket's reduced values into its parameters' .grad, but for the parameters no rank used
  // (`used[i] == 0`; an empty `used` counts every parameter as used).
  void finalize_bucket(const Bucket& bucket, const std::vector<int32_t>& used);
  void reduce_used_map(std::vector<int32_t>& used);  // all-reduces the per-parameter counts
  void report_unready() const;
  void rebuild_from_observed_order();

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::ProcessGroup> group_;
  ReducerOptions options_;

  std::vector<int64_t> order_;  // the visiting order of the last assignment
  std::vector<std::vector<size_t>> bucket_indices_;
  std::vector<Arena> arenas_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // param -> (bucket, position in bucket)

  // The hooks on the parameters' grad accumulators (defined in reducer.cpp: the accumulator's
  // pointer type differs between LibTorch versions).
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;

  // Per-iteration state, reset by begin_iteration().
  Phase phase_ = Phase::kIdle;
  std::vector<bool> ready_;
  std::vector<int64_t> ready_order_;
  size_t next_launch_ = 0;
  IterationStats stats_;

  CommHookFn hook_;  // empty: allreduce_hook on group_
  bool require_sync_ = true;
  bool rebuilt_ = false;
  bool started_ = false;  // a synchronised backward has run: too late to register a hook
  int64_t backward_count_ = 0;
  bool in_backward_ = false;
  // static_graph: hooks per parameter in one iteration (counted in the first), those still to
  // come in this one, and the parameters no rank used in the first (their .grad is left alone).
  std::vector<int64_t> expected_hooks_;
  std::vector<int64_t> hooks_left_;
  std::vector<int32_t> static_used_;
  // World size 1 with the plain all-reduce: the average of one gradient is itself, so the
  // hooks keep their bookkeeping (unused-parameter checks, stats) but copy nothing.
  bool passthrough_;
};

}  // namespace ddp::core
