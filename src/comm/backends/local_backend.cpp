// World size 1 with no dependencies: every collective is the identity and completes at once.
#include <ATen/ATen.h>

#include "backends/backends.h"

namespace ddp::comm {
namespace {

class LocalProcessGroup : public ProcessGroup {
 public:
  explicit LocalProcessGroup(const ProcessGroupOptions& options) : ProcessGroup(0, 1, options) {}
  std::string backend_name() const override { return "local"; }

 protected:
  WorkPtr do_all_reduce(at::Tensor&, ReduceOp, const CollectiveInfo&) override { return done(); }
  WorkPtr do_broadcast(at::Tensor&, int, const CollectiveInfo&) override { return done(); }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo&) override {
    output.view_as(input).copy_(input);
    return done();
  }
  // World size 1: the one block is this rank's own, and the reduction of one value is itself.
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp,
                            const CollectiveInfo&) override {
    output.view_as(input).copy_(input);
    return done();
  }
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo&) override {
    output.view_as(input).copy_(input);
    return done();
  }
  WorkPtr do_barrier(const CollectiveInfo&) override { return done(); }
  // The base class allows only ranks {0}.
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>&,
                                             const CollectiveInfo&) override {
    return std::make_shared<LocalProcessGroup>(options());
  }

 private:
  static WorkPtr done() { return std::make_shared<CompletedWork>(); }
};

}  // namespace

std::unique_ptr<ProcessGroup> make_local_process_group(const ProcessGroupOptions& options) {
  return std::make_unique<LocalProcessGroup>(options);
}

}  // namespace ddp::comm
