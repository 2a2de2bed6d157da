#pragma once
// Fully sharded data parallelism, as PyTorch's FSDP2 (`fully_shard`): each of N ranks holds 1/N of
// every unit's parameters, of their gradients and of the optimizer's state. A unit's parameters
// exist whole only while its forward or its backward runs: they are all-gathered before (the next
// unit's gather issued while this one computes), freed after; its gradients are reduce-scattered
// (averaged) into their owners' shards while the backward goes on, and the optimizer steps on the
// shards.
//
// A model that is a torch::nn::Sequential needs no change: its children are the units (or the
// modules named, anywhere in nested Sequentials) and the wrapper's forward runs them in order, as
// Sequential's does.
//
//   torch::nn::Sequential net = make_net();
//   ddp::FullyShardedDataParallel model(net, group);
//   torch::optim::Adam optimizer(model.parameters(), 1e-3);   // the shards
//   auto loss = loss_fn(model.forward(x), y);
//   loss.backward();      // returns with each shard's gradient averaged over the ranks
//   optimizer.step();
//
// Any other model names its units, and its forward calls each through ddp::nn::call, one line
// per unit: `x = block(x)` becomes `x = ddp::nn::call(block, x)`. That is what LibTorch's lack of
// forward hooks forces (PyTorch's FSDP gathers a unit in a forward pre-hook; a C++ module's
// forward is an ordinary method nobody can intercept: ddp/nn/forward_hooks.h). Outside a sharded
// model's forward, ddp::nn::call is the plain call, so the model still runs unwrapped:
//
//   ddp::FullyShardedDataParallel model(net, {net->encoder, net->decoder}, group);
//   auto y = model.forward_with([&] { return net->forward(x); });
//
// Parameters that belong to no unit (an embedding before the units, a head after them) form the
// root unit: gathered at the start of each forward, kept until the backward has reduced them.
//
// Units unused on some ranks: a unit that a rank's forward does not call (a branch its data takes,
// an expert no token of its batch chose), or whose output its loss leaves out, trains as under
// DDP's find_unused_parameters: the ranks' collectives stay in one order and the unit's gradient
// counts zero from that rank (Note [Units unused on some ranks] in src/core/fsdp/in_order.h).
// Where the unit is called but its output left out of the loss, give the loss to backward(loss)
// (a plain loss.backward() cannot tell, and the others would wait for its gradients until the
// group's timeout). Units are gathered in the order the ranks' last forward called them (the
// first forward: the order given). A unit is called at most once per forward.
//
// Buffers (BatchNorm's running statistics) are not sharded: each rank keeps its own, as under
// DistributedDataParallel with broadcast_buffers(false).
//
// The module's own parameters become views of the units' gathered buffers (Note [Parameters are
// views of the gathered buffer] in src/core/fsdp/unit.h). Outside a unit's forward and backward
// they hold no data: their sizes, dtype and names are there, but reading their values
// (weight.norm(), printing them, torch::save of the module, calling a unit without ddp::nn::call)
// throws LibTorch's error instead (Note [Parameters hold no data while the unit is not gathered]).
// state_dict() gives the whole model's values; parameters() the shards to optimize.

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/nn/forward_hooks.h"

namespace ddp {

// As FSDP2's MixedPrecisionPolicy: the dtype of the units' gathered parameters (so of their
// computation and of the all-gathers), the one gradients are reduce-scattered in, and the
// model's output's; the shards, their gradients and the optimizer keep the parameters' own dtype
// (float32). Unset: the parameters' own dtype (reduce_dtype: param_dtype; output_dtype: as the
// model computes it).
//
//   // bf16 compute and communication:
//   ddp::FullyShardOptions().mp_policy(ddp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16))
struct MixedPrecisionPolicy {
  TORCH_ARG(std::optional<c10::ScalarType>, param_dtype);
  TORCH_ARG(std::optional<c10::ScalarType>, reduce_dtype);
  TORCH_ARG(std::optional<c10::ScalarType>, output_dtype);
  // Floating tensors given to the model's forward and to each unit's are cast to param_dtype
  // first (a unit computes in its parameters' dtype whatever the code between units made).
  TORCH_ARG(bool, cast_forward_inputs) = true;
};

struct FullyShardOptions {
  // The next unit's all-gather is issued before this unit computes (in forward and in backward).
  TORCH_ARG(bool, prefetch) = true;
  // Units free their gathered parameters after their forward (and gather again for the backward).
  // false: kept from the forward to the end of the backward (less communication, more memory), as
  // FSDP2's reshard_after_forward=False.
  TORCH_ARG(bool, reshard_after_forward) = true;
  // Rank 0's parameters and buffers broadcast to every rank before sharding, as FSDP's
  // sync_module_states.
  TORCH_ARG(bool, init_sync) = true;
  TORCH_ARG(MixedPrecisionPolicy, mp_policy);
  // Hybrid sharding (HSDP, FSDP2's 2-D device mesh): the model's group shards (the ranks of one
  // host, say) and this one replicates (the ranks that hold the same shard: one per host). Each
  // unit's gradient is reduce-scattered in the sharding group, then each shard's all-reduced
  // (averaged) with the same shard on the other replicas; init_sync broadcasts its rank 0's
  // values over it first; every rank of both groups constructs the model. Null: no replicas.
  TORCH_ARG(std::shared_ptr<comm::ProcessGroup>, replicate_group);
};

namespace fsdp {

using Clock = std::chrono::steady_clock;

// When a unit's collectives and computation ran in the last iteration (a forward and the backward
// after it), for the timeline; time_point() for what did not happen (the root unit has no
// forward of its own; a unit kept gathered after its forward is not gathered again).
struct UnitTimes {
  std::string name;
  Clock::time_point forward_gather;  // its all-gather issued (ahead, with prefetch)
  Clock::time_point forward_begin;   // the gather waited for: its forward starts
  Clock::time_point forward_end;
  Clock::time_point backward_gather;  // issued ahead of its backward
  Clock::time_point backward_begin;   // its output's gradient arrived, the gather waited for
  Clock::time_point backward_end;     // its last parameter's gradient: the reduce-scatter issued
  Clock::time_point reduce_done;      // the reduce-scatter waited for
};

// How a unit's parameters lie in its flat buffer: each at an offset, in registration order, the
// total padded to a multiple of the world size so that every rank's shard is as long. A pure
// function.
class Claims;  // which unit holds which parameter (fully_shard.cpp)

struct FlatLayout {
  std::vector<int64_t> offsets;  // of each parameter in the flat buffer
  int64_t numel = 0;             // of the parameters together
  int64_t padded = 0;            // numel rounded up to a multiple of world_size
  int64_t shard = 0;             // padded / world_size: each rank's part
};
FlatLayout plan_flat_layout(const std::vector<int64_t>& numels, int world_size);

// The order of the next forward's gathers (Note [Units unused on some ranks] in
// src/core/fsdp/in_order.h), as indices of the units: those some rank's forward called, by
// `positions` (each unit's earliest 1-based place among any rank's calls; 0: none called it;
// ties in their `previous` order), then the others in their `previous` order. A pure function.
std::vector<size_t> next_gather_order(const std::vector<int32_t>& positions,
                                      const std::vector<size_t>& previous);

// Whether LibTorch's error message `error` is that of a read of a parameter that holds no data
// (a unit not gathered). A pure function.
bool reads_parameters_without_data(const std::string& error);

}  // namespace fsdp

class FullyShardedDataParallel {
 public:
  // A Sequential, run by forward(): its `units` (empty: each child with parameters), anywhere in
  // it or in Sequentials nested in it, each gathered around its forward. A collective (the
  // init_sync broadcasts). Throws InputError for a unit whose parameters mix dtypes or devices, a
  // weight tied across units, or nested units.
  FullyShardedDataParallel(torch::nn::Sequential module, std::shared_ptr<comm::ProcessGroup> group,
                           FullyShardOptions options = {},
                           std::vector<std::shared_ptr<torch::nn::Module>> units = {});
  // Any module, with `units` among its descendants (each called through ddp::nn::call by the
  // module's forward); their parameters are sharded unit by unit, the others as the root unit.
  FullyShardedDataParallel(std::shared_ptr<torch::nn::Module> module,
                           std::vector<std::shared_ptr<torch::nn::Module>> units,
                           std::shared_ptr<comm::ProcessGroup> group,
                           FullyShardOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The Sequential's forward, unit by unit (constructed from a Sequential only); a nested
  // Sequential that holds units runs child by child too.
  torch::Tensor forward(torch::Tensor input);
  // Installs the model's hooks (ddp::nn::ForwardHooks) for one forward.
  class Forward {
   public:
    // Gathers the root unit; throws InputError inside another sharded model's forward.
    explicit Forward(FullyShardedDataParallel& model);
    // After the forward returned: frees what no backward needs.
    void finish();
    // A LibTorch error in the forward rethrown as InputError, saying in which unit's forward it
    // arose and, where it is a read of parameters that hold no data, that a unit was not called
    // through ddp::nn::call (Note [Parameters hold no data while the unit is not gathered] in
    // src/core/fsdp/unit.h).
    [[noreturn]] void fail(const c10::Error& error);
    // Without finish() (the forward threw): frees everything it gathered.
    ~Forward();
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;

   private:
    FullyShardedDataParallel& model_;
    bool grad_enabled_;  // at the forward's start: whether a backward may follow
    bool finished_ = false;
  };

  // Any forward: `run` calls the module however it wants, on `inputs` (tensors) cast as the
  // mixed precision policy says (a `run` that captures its inputs gets them as they are); its
  // units through ddp::nn::call. A tensor output is cast to the policy's output_dtype.
  template <class F, class... Tensors>
  auto forward_with(F&& run, const Tensors&... inputs) {
    Forward scope(*this);
    auto output = [&] {
      try {
        return run(cast_input(inputs)...);
      } catch (const c10::Error& error) {
        scope.fail(error);
      }
    }();
    scope.finish();
    if constexpr (std::is_same_v<decltype(output), torch::Tensor>) {
      return cast_output(std::move(output));
    } else {
      return output;
    }
  }
  // A floating tensor in the policy's param_dtype (with cast_forward_inputs), any other as it is.
  torch::Tensor cast_input(const torch::Tensor& input) const;
  // A floating tensor in the policy's output_dtype, when it has one.
  torch::Tensor cast_output(torch::Tensor output) const;

  // loss.backward(), with a LibTorch error raised in it rethrown as InputError naming the unit
  // whose backward was running (the last whose output's gradient had arrived) and what a unit's
  // backward needs. Given the loss, it also knows which units' parameters the loss reaches, so a
  // unit whose output this rank's loss leaves out sends zeros at once. A plain loss.backward()
  // trains the same where every output of every called unit reaches the loss, with LibTorch's
  // error alone.
  void backward(const torch::Tensor& loss);

  // Scales the shards' gradients so that the 2-norm of the whole model's gradient (over every
  // rank's shards) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_ on the unsharded
  // model (FSDP1's clip_grad_norm_). Returns that norm, before clipping. A collective.
  double clip_grad_norm(double max_norm);

  // As FSDP2's: false makes the backwards that follow keep each unit's gradients whole (added up
  // over the backwards, one flat buffer per unit) instead of reduce-scattering them; the first
  // backward after set_requires_gradient_sync(true) reduces them with its own. Gradient
  // accumulation over K micro-batches: false for the first K-1, true for the last, which alone
  // communicates (as at K = 1), at the cost of every unit's gradients held whole in between.
  void set_requires_gradient_sync(bool sync);

  // The shards the optimizer steps (one per unit with parameters, the root unit's last): leaves
  // in the parameters' own dtype (float32) whatever the policy, whose .grad the backward sets to
  // this rank's part of the averaged gradient. A unit's frozen parameters (requires_grad false)
  // are sharded apart and are not in its shard; a unit with nothing trainable has a shard that
  // does not require grad and never gets a gradient (optimizers skip it).
  std::vector<torch::Tensor> parameters() const;
  // The shards as FSDP1's use_orig_params shows them, for an optimizer with per-parameter
  // options (parameter groups: weight decay off for biases and norms): each trainable parameter
  // of the model under its name, as this rank's part of it, a 1-D leaf viewing its unit's shard
  // (empty where this rank holds none of it) that the optimizer steps in place. Once they are
  // asked for, the backward gives them the gradients (the same parts of what it gave the shards)
  // and the shards none: give an optimizer these or parameters(), not both. A frozen parameter is
  // not among them.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  // The whole model's parameters and buffers under the module's names, as its own state_dict:
  // the parameters gathered from the shards (a collective), the buffers this rank's.
  std::vector<std::pair<std::string, torch::Tensor>> state_dict();
  // state_dict()'s keys in its order: each parameter with a meta tensor of the sizes and dtype
  // state_dict() gives it (no data; a tied weight's is one tensor under both names), each buffer
  // with the module's own. No collective.
  std::vector<std::pair<std::string, torch::Tensor>> state_dict_keys() const;
  // state_dict()'s parameters one unit at a time, for a model too large to gather whole (a
  // checkpoint streamed to a file): each parameter's gathered value handed to `visit` (a tied
  // weight once, under the name it was sharded by), the unit's copies freed before the next
  // unit's gather. A collective; every rank visits.
  void gather_each_unit(
      const std::function<void(const std::string& name, const torch::Tensor& value)>& visit);
  // Sets the shards (each rank its part) and the buffers from a whole model's state, keyed as
  // state_dict's (no collective), reading of each parameter only the elements of this rank's
  // shard. Throws InputError naming a missing key or a wrong shape.
  void load_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& state);

  // State laid out as unit `unit`'s shard (an optimizer's momentum or moments of
  // parameters()[unit]) and the whole tensors it is part of, shaped as the unit's parameters:
  // unshard gathers them from every rank's `shard_like` (a collective), named as the parameters;
  // shard takes this rank's part of `whole` (in parameter_names(unit)'s order; no collective).
  std::vector<std::pair<std::string, torch::Tensor>> unshard(int unit,
                                                             const torch::Tensor& shard_like);
  torch::Tensor shard(int unit, const std::vector<torch::Tensor>& whole) const;
  // The names in the model of unit `unit`'s parameters.
  std::vector<std::string> parameter_names(int unit) const;
  // Every flat buffer's shard on this rank, as a sharded checkpoint saves them: parameters()'
  // (one per unit), then the frozen parameters' of each unit that has trainable ones too (sharded
  // apart: Note [Frozen parameters: a flat buffer of their own] in src/core/fsdp/unit.h); and the
  // names in the model of flat shard `shard`'s parameters.
  std::vector<torch::Tensor> flat_shards() const;
  std::vector<std::string> flat_shard_names(int shard) const;

  torch::nn::Module& module() { return *module_; }
  int num_units() const;  // with parameters; the root unit included when there is one
  // Each unit's times in the last iteration, in parameters()' order.
  std::vector<fsdp::UnitTimes> last_iteration() const;
  // Bytes of parameters this rank holds now (shards and whatever is gathered): for tests and the
  // memory benchmark.
  int64_t resident_parameter_bytes() const;

 private:
  struct State;
  // The parameters no unit holds (not in `claims`), as the root unit.
  void add_root_unit(fsdp::Claims& claims);

  std::shared_ptr<torch::nn::Module> module_;
  std::unique_ptr<State> state_;
};

}  // namespace ddp
