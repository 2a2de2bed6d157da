#include "ddp/core/comm_hook.h"

#include <ATen/ATen.h>

namespace ddp::core {

FuturePtr Future::of(comm::WorkPtr work, torch::Tensor value) {
  FuturePtr future(new Future());
  future->work_ = std::move(work);
  future->value_ = std::move(value);
  return future;
}

FuturePtr Future::ready(torch::Tensor value) {
  return of(nullptr, std::move(value));
}

FuturePtr Future::then(Continuation next) {
  FuturePtr future(new Future());
  future->first_ = shared_from_this();
  future->next_ = std::move(next);
  return future;
}

torch::Tensor Future::wait() {
  if (done_) return value_;
  if (first_) {
    value_ = next_(first_->wait());
    first_.reset();  // its tensors are no longer needed
    next_ = nullptr;
  } else if (work_) {
    work_->wait();
  }
  done_ = true;
  return value_;
}

bool Future::is_completed() {
  if (done_) return true;
  // A continuation has not run before wait(): not complete, even if its input is.
  return !first_ && (!work_ || work_->is_completed());
}

GradBucket::GradBucket(size_t index, size_t count, torch::Tensor buffer,
                       std::vector<torch::Tensor> gradients, std::vector<torch::Tensor> parameters)
    : index_(index),
      count_(count),
      buffer_(std::move(buffer)),
      gradients_(std::move(gradients)),
      parameters_(std::move(parameters)) {}

FuturePtr allreduce_hook(comm::ProcessGroup& group, GradBucket& bucket) {
  auto buffer = bucket.buffer();
  return Future::of(group.all_reduce(buffer, comm::ReduceOp::kAvg), buffer);
}

namespace {

FuturePtr compress_hook(comm::ProcessGroup& group, GradBucket& bucket, c10::ScalarType wire_type) {
  auto wire = bucket.buffer().div(group.world_size()).to(wire_type);
  return Future::of(group.all_reduce(wire, comm::ReduceOp::kSum), wire)
      ->then([buffer = bucket.buffer()](torch::Tensor reduced) mutable {
        buffer.copy_(reduced);  // decompress
        return buffer;
      });
}

}  // namespace

FuturePtr fp16_compress_hook(comm::ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, at::kHalf);
}

FuturePtr bf16_compress_hook(comm::ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, at::kBFloat16);
}

}  // namespace ddp::core
