#pragma once
// DistributedDataParallel for LibTorch: wraps any torch::nn::Module, as PyTorch's wraps an
// nn.Module. The wrapped module is registered as "module", so the wrapper's state_dict has
// DataParallel's key names ("module.fc.weight").
//
//   auto group = ddp::init_process_group();  // however the process was started
//   auto net = std::make_shared<Net>();       // or a TORCH_MODULE holder: Net net;
//   ddp::DistributedDataParallel model(net, group,
//                                      ddp::DistributedDataParallelOptions().bucket_cap_mb(25));
//   torch::optim::SGD optimizer(model->parameters(), /*lr=*/0.01);
//   model->zero_grad();
//   auto loss = loss_fn(model->forward(x), y);  // whatever Net::forward takes and returns
//   loss.backward();   // returns with the gradients averaged over the ranks
//   optimizer.step();
//
// The wrapper's type follows the module's (DistributedDataParallel<Net>, deduced), so that
// model->forward(...) is Net's own forward, overloads, several arguments, tuples and structs
// included, checked by the compiler. DistributedDataParallel<> wraps a module known only as
// torch::nn::Module; it has no forward of its own: call it with forward_with.
//
// Construction is collective: every rank checks that all ranks hold the same parameters
// (names, shapes, dtypes), then rank 0's parameters and buffers are broadcast (unless
// init_sync(false), as PyTorch's init_sync=False: then construction communicates nothing).

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "ddp/comm/process_group.h"
#include "ddp/core/reducer.h"

namespace ddp {

struct DistributedDataParallelOptions {
  TORCH_ARG(double, bucket_cap_mb) = 25.0;   // MiB per bucket after the first
  TORCH_ARG(double, first_bucket_mb) = 1.0;  // MiB of the first bucket (the last gradients)
  // Rank 0's buffers to all ranks at the first forward of each iteration.
  TORCH_ARG(bool, broadcast_buffers) = true;
  TORCH_ARG(bool, find_unused_parameters) = false;
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // The graph is the same every iteration, so parameters may get gradients several times in one
  // backward (activation checkpointing, a checkpointed block used twice): the first iteration
  // counts them, later ones reduce each parameter after its last (reducer.h).
  TORCH_ARG(bool, static_graph) = false;
  // The constructor's check of the parameters across ranks and broadcast of rank 0's; off where
  // the ranks already hold the same state by other means (an elastic heal).
  TORCH_ARG(bool, init_sync) = true;
};

// What every DistributedDataParallel<M> shares, whatever M: the broadcasts, the reducer, hooks,
// no_sync, Join. Not used directly: DistributedDataParallel<M> below is.
class DistributedDataParallelBase : public torch::nn::Module {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                              std::shared_ptr<comm::ProcessGroup> group,
                              DistributedDataParallelOptions options = {});

  // Any forward at all: `run` calls the wrapped module however it wants, after the buffer
  // broadcast: model->forward_with([&] { return net->forward(a, b); }). For the module known
  // only as torch::nn::Module, or a forward that is a template taking a lambda.
  template <class F>
  auto forward_with(F&& run) {
    pre_forward();
    return run();
  }

  // Broadcasts rank 0's buffers if broadcast_buffers. A collective: every rank calls it once per
  // forward; forward() and forward_with() call it. With gradients enabled it broadcasts once per
  // iteration: at the first forward after a backward (or the first ever), so that a second
  // forward before the backward (a siamese or contrastive step) trains on from the buffers the
  // first left, as one process would. Without gradients (evaluation) it broadcasts every time.
  // The copy leaves the buffers' version counters alone, so tensors saved by a forward stay valid.
  void pre_forward();

  // As PyTorch's register_comm_hook(state, hook): each bucket is reduced by `hook(*state,
  // bucket)`, which returns the future of the averaged bucket (comm_hook.h has the contract and
  // the built-ins; powersgd.h has PowerSGD). `state` is shared with the caller, who may read it
  // during training. Once, before the first backward.
  template <class State, class Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    if (!reducer_) return;  // no parameter requires a gradient: nothing to reduce
    reducer_->register_comm_hook([state = std::move(state), hook = std::move(hook)](
                                     core::GradBucket& bucket) { return hook(*state, bucket); });
  }

  // Inside the guard's lifetime, backward accumulates gradients locally and reduces nothing; the
  // first backward after it reduces the accumulated sum. As PyTorch's `with model.no_sync():`.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(core::Reducer& reducer);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    core::Reducer& reducer_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  // Drops the gradients (set_to_none, the default of LibTorch 2.x's modules and optimizers), or
  // zeroes them in place. Dropping is the cheaper: no memset, and the next backward's gradient
  // becomes .grad without an addition; with gradient_as_bucket_view the reducer then copies it into
  // its bucket view once and points .grad there again. Use this, not the optimizer's zero_grad(),
  // with gradient_as_bucket_view: LibTorch 1.13's Optimizer::zero_grad() calls detach_() on each
  // .grad, which refuses the bucket views.
  void zero_grad(bool set_to_none = true) override;

  // Another bucket size from the next backward on (Reducer::set_bucket_cap): on every rank with
  // the same size, between iterations. What bucket_cap_mb "auto" (bucket_tuning.h) tries.
  void set_bucket_cap_mb(double mb);

  // Uneven inputs, as PyTorch's `with Join([model]):` (join.h wraps the two): between
  // begin_join() and finish_join(), each forward first tells the others that this rank still
  // trains (one small all-reduce). finish_join(), after this rank's last batch, repeats the
  // collectives of the others' iterations with zero gradients until every rank is done, then
  // gives every rank the model of the last rank to finish. A joined rank adds zeros and the
  // average still divides by the world size (PyTorch's divide_by_initial_world_size). Each
  // iteration must be one forward then one backward (no_sync ones too, with the guard around
  // both), and no other collective may run between them.
  void begin_join();
  void finish_join();

  torch::nn::Module& module() { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() { return module_; }
  core::Reducer& reducer() { return *reducer_; }
  comm::ProcessGroup& group() { return *group_; }
  const DistributedDataParallelOptions& options() const { return options_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DistributedDataParallelOptions options_;
  std::unique_ptr<core::Reducer> reducer_;
  int64_t buffers_broadcast_at_ = -1;  // the reducer's backward count at the last broadcast
  bool joining_ = false;               // between begin_join() and finish_join()

  bool buffers_due();  // this forward broadcasts the buffers (the once-per-iteration rule)
  // Join: this forward's notice; returns the lowest rank still training.
  int join_notify(bool broadcasts_buffers);
};

namespace detail {
template <class M, class = void, class... Args>
struct HasForward : std::false_type {};
template <class M, class... Args>
struct HasForward<M, std::void_t<decltype(std::declval<M&>().forward(std::declval<Args>()...))>,
                  Args...> : std::true_type {};
template <class>
inline constexpr bool kAlwaysFalse = false;
}  // namespace detail

// The wrapper of a module of type M: forward(args...) is M's forward(args...) after the buffer
// broadcast, with M's return type.
template <class M>
class DistributedDataParallelImpl : public DistributedDataParallelBase {
  static_assert(std::is_base_of_v<torch::nn::Module, M>,
                "ddp::DistributedDataParallel wraps a torch::nn::Module (a struct deriving from "
                "it, held in a std::shared_ptr or a TORCH_MODULE holder)");

 public:
  DistributedDataParallelImpl(std::shared_ptr<M> module, std::shared_ptr<comm::ProcessGroup> group,
                              DistributedDataParallelOptions options = {})
      : DistributedDataParallelBase(module, std::move(group), options), typed_(std::move(module)) {}
  // From a module holder (torch::nn::Linear, a TORCH_MODULE of yours): the module it holds.
  DistributedDataParallelImpl(const torch::nn::ModuleHolder<M>& holder,
                              std::shared_ptr<comm::ProcessGroup> group,
                              DistributedDataParallelOptions options = {})
      : DistributedDataParallelImpl(holder.ptr(), std::move(group), options) {}

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    if constexpr (detail::HasForward<M, void, Args&&...>::value) {
      pre_forward();
      return typed_->forward(std::forward<Args>(args)...);
    } else {
      static_assert(detail::kAlwaysFalse<M>,
                    "ddp::DistributedDataParallel: the wrapped module has no forward taking "
                    "these arguments. Give the module's type a forward(...) that takes them, "
                    "wrap the module by its own type (std::shared_ptr<Net>, not "
                    "std::shared_ptr<torch::nn::Module>), or call it yourself: "
                    "model->forward_with([&] { return net->forward(...); })");
    }
  }

  M& module() { return *typed_; }
  std::shared_ptr<M> module_ptr() { return typed_; }

 private:
  std::shared_ptr<M> typed_;  // the base's module, by its own type
};

// The holder, as TORCH_MODULE would make it, over the module's type; deduced from what is
// wrapped: ddp::DistributedDataParallel model(net, group) with `net` a std::shared_ptr<Net> or a
// holder of NetImpl. DistributedDataParallel<> (torch::nn::Module) is the one to name where the
// type must be spelled for any module: a member set later, a function's parameter.
template <class M = torch::nn::Module>
class DistributedDataParallel : public torch::nn::ModuleHolder<DistributedDataParallelImpl<M>> {
 public:
  using torch::nn::ModuleHolder<DistributedDataParallelImpl<M>>::ModuleHolder;
  using Impl = DistributedDataParallelImpl<M>;
};

template <class M, class... Rest>
DistributedDataParallel(std::shared_ptr<M>, Rest&&...) -> DistributedDataParallel<M>;
template <class M, class... Rest>
DistributedDataParallel(torch::nn::ModuleHolder<M>, Rest&&...) -> DistributedDataParallel<M>;

// Every rank's tensors become those of rank `root`: one broadcast per (dtype, device) group of up
// to 25 MiB, flattened. A collective. Written as `.data` would be, without bumping the tensors'
// version counters (autograd's saved copies of them stay usable).
void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                         int root = 0);

// Checks that every rank holds the same named tensors (names, shapes, dtypes, in order).
// A collective. Throws InputError naming the first difference from rank 0's, on every rank.
void verify_same_across_ranks(comm::ProcessGroup& group, const std::vector<std::string>& names,
                              const std::vector<torch::Tensor>& tensors);

}  // namespace ddp
