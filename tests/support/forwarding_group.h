#pragma once
// A process group that hands every collective to another (`inner`), which numbers and runs it:
// the base of the tests' decorators, which override what they watch or break.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::testing {

class ForwardingGroup : public ddp::comm::ProcessGroup {
 public:
  explicit ForwardingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->world_size(), inner->options()),
        inner_(std::move(inner)) {
    wrap(*inner_);
  }
  std::string backend_name() const override { return inner_->backend_name(); }

 protected:
  using WorkPtr = ddp::comm::WorkPtr;
  using Info = ddp::comm::CollectiveInfo;
  using Op = ddp::comm::ReduceOp;
  WorkPtr do_all_reduce(at::Tensor& t, Op op, const Info&) override {
    return inner_->all_reduce(t, op);
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const Info&) override {
    return inner_->broadcast(t, root);
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const Info&) override {
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, Op op, const Info&) override {
    return inner_->reduce_scatter(out, in, op);
  }
  WorkPtr do_all_to_all(at::Tensor& out, const at::Tensor& in, const Info&) override {
    return inner_->all_to_all(out, in);
  }
  WorkPtr do_barrier(const Info&) override { return inner_->barrier(); }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks, const Info&) override {
    return inner_->new_group(ranks);
  }
  at::Tensor do_allocate_buffer(int64_t numel, const at::TensorOptions& options) override {
    return inner_->allocate_buffer(numel, options);  // a collective of inner's (shm's)
  }

  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace ddp::testing
