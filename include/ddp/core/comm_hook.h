#pragma once
// Communication hooks, as PyTorch's DistributedDataParallel.register_comm_hook: a hook decides how
// one bucket of gradients is reduced over the ranks. The reducer hands it the bucket once all of
// the bucket's gradients are in (while backward still runs), and waits on the future it returns
// before the optimizer step; the future's value becomes the bucket's averaged gradients.
//
//   // The built-ins take the process group as their state, as in PyTorch:
//   model->register_comm_hook(group, ddp::fp16_compress_hook);
//   // A hook of your own: any state, any callable (examples/custom_hook shows one).
//   struct Counter { std::shared_ptr<ddp::comm::ProcessGroup> group; int64_t calls = 0; };
//   model->register_comm_hook(std::make_shared<Counter>(Counter{group}),
//                             [](Counter& s, ddp::GradBucket& bucket) {
//                               ++s.calls;
//                               return ddp::allreduce_hook(*s.group, bucket);
//                             });
//
// The contract, PyTorch's: the bucket's buffer holds this rank's gradients, not yet divided by
// the world size; the hook returns a future whose value is a tensor shaped like the buffer that
// holds the average over the ranks (the built-ins divide before or after reducing). A hook must
// issue the same collectives in the same order on every rank (Note [Collective order is
// identical on all ranks], process_group.h).

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::core {

class Future;
using FuturePtr = std::shared_ptr<Future>;

// A tensor that will be ready once a collective is done, and continuations that turn it into the
// next value. Continuations run inside wait(), on the waiting thread, in the order they were
// chained: the reducer waits on its buckets in bucket order, so a continuation may issue
// collectives (PowerSGD's do) and every rank still issues them in the same order. Not
// thread-safe, as comm::Work.
class Future : public std::enable_shared_from_this<Future> {
 public:
  using Continuation = std::function<torch::Tensor(torch::Tensor)>;

  // Done when `work` is done; its value is `value` (the tensor the collective writes into).
  static FuturePtr of(comm::WorkPtr work, torch::Tensor value);
  // Already done.
  static FuturePtr ready(torch::Tensor value);
  // The future of `next(value of this)`, computed inside wait(): reads as PyTorch's fut.then().
  FuturePtr then(Continuation next);

  // Blocks until the value is ready (running the pending continuations) and returns it. Throws
  // what the collective or a continuation threw (CommError on a failed or timed-out collective).
  torch::Tensor wait();
  // True once wait() would return without blocking on a collective or running a continuation;
  // never blocks.
  bool is_completed();

 private:
  Future() = default;
  comm::WorkPtr work_;
  FuturePtr first_;    // set for a continuation's future: the future it continues
  Continuation next_;  // what turns first_'s value into this one's
  torch::Tensor value_;
  bool done_ = false;
};

// One bucket as a hook sees it.
class GradBucket {
 public:
  GradBucket(size_t index, size_t count, torch::Tensor buffer, std::vector<torch::Tensor> gradients,
             std::vector<torch::Tensor> parameters);

  // 0 for the first bucket reduced in an iteration (the last layers' gradients).
  size_t index() const { return index_; }
  // The last bucket of the iteration: hooks that count iterations (PowerSGD) count here.
  bool is_last() const { return index_ + 1 == count_; }
  // The bucket's gradients back to back (flat, 1-D): this rank's, not yet averaged.
  const torch::Tensor& buffer() const { return buffer_; }
  // Per parameter, its gradient as a view into buffer(), shaped like the parameter.
  const std::vector<torch::Tensor>& gradients() const { return gradients_; }
  // The bucket's parameters, in the order of gradients().
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }

 private:
  size_t index_;
  size_t count_;
  torch::Tensor buffer_;
  std::vector<torch::Tensor> gradients_;
  std::vector<torch::Tensor> parameters_;
};

// What the reducer calls per bucket: the state is bound in (DistributedDataParallel's
// register_comm_hook does it).
using CommHookFn = std::function<FuturePtr(GradBucket&)>;

// The built-in hooks, as torch.distributed.algorithms.ddp_comm_hooks.default_hooks. Their state
// is the process group.
//
// The average in the gradients' dtype (what the reducer does when no hook is registered).
FuturePtr allreduce_hook(comm::ProcessGroup& group, GradBucket& bucket);
// Divided by the world size in the gradients' dtype, cast to float16 (half the bytes of float32
// on the wire), summed, cast back into the buffer. PyTorch casts first and divides in float16;
// dividing first also keeps a gradient above float16's largest value (65504) whose share of the
// average is below it.
FuturePtr fp16_compress_hook(comm::ProcessGroup& group, GradBucket& bucket);
// The same with bfloat16 (float32's range, 8 bits of mantissa).
FuturePtr bf16_compress_hook(comm::ProcessGroup& group, GradBucket& bucket);

}  // namespace ddp::core

namespace ddp {
using core::allreduce_hook;
using core::bf16_compress_hook;
using core::fp16_compress_hook;
using core::Future;
using core::FuturePtr;
using core::GradBucket;
}  // namespace ddp
