#include "ddp/core/fully_shard.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_set>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "in_order.h"
#include "torch_compat.h"
#include "unit.h"

namespace ddp {
namespace fsdp {

const char* const kRootUnit = "(root)";

// Which unit holds each parameter tensor, under which names, as the units are made: a tensor
// reached under a second name in the same unit is tied there (an alias, sharded once); in another
// unit, or once under the same name (nested units), it is refused naming both.
class Claims {
 public:
  // True when `param` is new (the unit `unit` shards it as `name`); false when it is an alias of
  // the same unit's (recorded in `aliases`: name -> the name it is sharded under). Throws
  // InputError for a tensor another unit holds, or a name seen before.
  bool claim(const torch::Tensor& param, const std::string& name, const std::string& unit,
             std::map<std::string, std::string>& aliases);
  // Whether a unit other than the root holds `param` under `name`.
  bool claimed_as(const torch::Tensor& param, const std::string& name) const;

 private:
  struct Claim {
    std::string unit;
    std::string name;             // sharded as
    std::set<std::string> names;  // every name seen
  };
  std::map<const c10::TensorImpl*, Claim> by_tensor_;
};

namespace {

std::vector<std::shared_ptr<torch::nn::Module>> children_of(const torch::nn::SequentialImpl& seq) {
  std::vector<std::shared_ptr<torch::nn::Module>> children;
  for (const auto& child : seq) children.push_back(child.ptr());
  return children;
}

// Runs `ready` after the parameter's gradient has been accumulated into .grad (a post hook on its
// AccumulateGrad node; a Tensor hook would run before accumulation).
// The autograd nodes a backward from `root` runs (DDP's search for unused parameters).
std::unordered_set<const torch::autograd::Node*> reachable_from(const torch::Tensor& root) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  if (auto node = torch::autograd::impl::gradient_edge(root).function) stack.push_back(node.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return seen;
}

class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> ready) : ready_(std::move(ready)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    ready_();
    return outputs;
  }

 private:
  std::function<void()> ready_;
};

// Under a param_dtype, a BatchNorm would compute with weights in it and running statistics in
// their own dtype, which LibTorch's batch_norm refuses deep in the first forward ("expected
// scalar type BFloat16 but found Float"): said here, by name, before anything runs.
void check_batch_norms(const torch::nn::Module& model, const MixedPrecisionPolicy& policy) {
  if (!policy.param_dtype()) return;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const auto& module = *item.value();
    if (module.name().find("BatchNorm") == std::string::npos) continue;
    for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
      const auto dtype = buffer.value().scalar_type();
      if (!torch::isFloatingType(dtype) || dtype == *policy.param_dtype()) continue;
      throw InputError(fmt::format(
          "fully_shard: {} ({}) keeps its {} in {}, which LibTorch's batch_norm cannot mix with "
          "{} weights (param_dtype of the mixed precision policy); use autocast instead, or a "
          "model without BatchNorm",
          item.key().empty() ? "the model" : item.key(), module.name(), buffer.key(),
          comm::dtype_name(dtype), comm::dtype_name(*policy.param_dtype())));
    }
  }
}

}  // namespace

bool Claims::claim(const torch::Tensor& param, const std::string& name, const std::string& unit,
                   std::map<std::string, std::string>& aliases) {
  auto [it, added] = by_tensor_.emplace(param.unsafeGetTensorImpl(), Claim{unit, name, {name}});
  if (added) return true;
  Claim& first = it->second;
  if (first.names.count(name) != 0) {  // the same module reached through two units
    throw InputError(
        fmt::format("fully_shard: parameter {} belongs to units {} and {}; units do not nest", name,
                    first.unit, unit));
  }
  if (first.unit != unit) {
    throw InputError(fmt::format(
        "fully_shard: parameter {} (unit {}) is the same tensor as {} (unit {}): a tied "
        "parameter is gathered with one unit, so the modules that share it must be in the same "
        "unit (name a module that holds both as the unit, or leave both to the root unit)",
        name, unit, first.name, first.unit));
  }
  first.names.insert(name);
  aliases[name] = first.name;
  return false;
}

bool Claims::claimed_as(const torch::Tensor& param, const std::string& name) const {
  auto it = by_tensor_.find(param.unsafeGetTensorImpl());
  return it != by_tensor_.end() && it->second.unit != fsdp::kRootUnit &&
         it->second.names.count(name);
}

std::vector<size_t> next_gather_order(const std::vector<int32_t>& positions,
                                      const std::vector<size_t>& previous) {
  std::vector<size_t> called, rest;
  for (size_t unit : previous) (positions.at(unit) > 0 ? called : rest).push_back(unit);
  std::stable_sort(called.begin(), called.end(),
                   [&](size_t a, size_t b) { return positions[a] < positions[b]; });
  called.insert(called.end(), rest.begin(), rest.end());
  return called;
}

bool reads_parameters_without_data(const std::string& error) {
  // Our own message (where the release lets a tensor carry it: 2.6 does) and 1.13's two for a
  // tensor without storage.
  for (const char* marker : {"holds no data while the unit is not gathered",
                             "Tensor that doesn't have storage", "Cannot access storage of"}) {
    if (error.find(marker) != std::string::npos) return true;
  }
  return false;
}

}  // namespace fsdp

using fsdp::children_of;

// The units and what one iteration has done with them (Note [Units unused on some ranks] in
// in_order.h says in which order every rank issues the collectives). Unit by unit:
//   forward:  before() issues the gathers due up to the unit, waits for its own and issues the
//             next one's; after() arranges its backward on the output (a tensor hook) and frees
//             the unit. The end of the forward agrees with the other ranks on what the backward
//             takes part in (plan_backward).
//   backward: the output's hook issues the gathers due up to the unit and the next one's, and
//             waits for its own; when the unit's last expected gradient is in, the unit is freed
//             and the reduce-scatters due issued (each after the previous one has finished, so that
//             one flat gradient is in flight at a time); at the end of the backward (autograd's
//             callback) the rest is issued, waited for and freed.
struct FullyShardedDataParallel::State : nn::ForwardHooks {
  std::shared_ptr<comm::ProcessGroup> group;
  std::shared_ptr<comm::ProcessGroup> reduce_group;  // the reduce-scatters' (new_group of all)
  FullyShardOptions options;
  fsdp::BufferPool pool;  // before the units, which give their buffers back to it
  std::optional<torch::nn::Sequential> sequential;
  std::vector<std::unique_ptr<fsdp::Unit>> units;  // the named units in order, the root last
  fsdp::Unit* root = nullptr;
  std::vector<fsdp::Unit*> named;  // the units but the root, as given: their indices everywhere
  std::map<const torch::nn::Module*, fsdp::Unit*> by_module;
  std::map<std::string, std::string> aliases;  // a tied parameter's other names: the unit's name
  std::vector<compat::GradAccumulator> accumulators;  // kept alive: autograd holds them weakly
  std::vector<uintptr_t> hook_keys;
  // Each parameter's grad accumulator: whose, and which of its params().
  std::map<const torch::autograd::Node*, std::pair<fsdp::Unit*, size_t>> accumulated;
  std::vector<fsdp::Unit*> order;  // the forward's gathers, the same on every rank

  // This iteration's.
  std::vector<fsdp::Unit*> forward_order;  // units as this forward called them
  fsdp::Unit* entered = nullptr;           // whose forward runs now (before() without after())
  // Each unit's outputs' nodes (in after()): whether a loss reaches the unit.
  std::map<const fsdp::Unit*, std::vector<std::weak_ptr<torch::autograd::Node>>> output_nodes;
  std::map<fsdp::Unit*, int> inputs_pending;  // input gradients still to come, per unit
  fsdp::InOrder forward_gathers, backward_gathers, reduces;
  std::set<const fsdp::Unit*> runs_here;  // whose backward this rank runs (plan_backward)
  std::set<const fsdp::Unit*> begun;      // whose backward began
  std::vector<fsdp::Unit*> dropped;       // gathered for the other ranks only: freed next
  bool planned = false;                   // a backward is planned and has not begun
  // The last forward's plan: the units in the backward (gathers) and those reduced, in order.
  std::vector<fsdp::Unit*> planned_gathers, planned_reduces;
  bool gradient_sync = true;           // set_requires_gradient_sync
  fsdp::Unit* last_reduced = nullptr;  // whose reduce-scatter is in flight
  bool in_backward = false;
  fsdp::Unit* backward_unit = nullptr;  // whose backward began last (before_backward)

  fsdp::Unit* find(const torch::nn::Module& module) const {
    auto it = by_module.find(&module);
    return it == by_module.end() ? nullptr : it->second;
  }
  bool wants(const torch::nn::Module& module) override { return find(module) != nullptr; }
  void before(const torch::nn::Module& module) override { before(*find(module)); }
  void after(const torch::nn::Module& module, const std::vector<torch::Tensor*>& outputs) override {
    after(*find(module), outputs);
  }
  torch::Tensor input(const torch::nn::Module& module, torch::Tensor x) override {
    return watch_input(*find(module), cast_input(x));
  }
  // Note [Frozen parameters: freed after the unit's backward]
  torch::Tensor watch_input(fsdp::Unit& unit, torch::Tensor x);
  void input_grad_arrived(fsdp::Unit& unit);
  torch::Tensor cast_input(const torch::Tensor& x) const {
    const auto& policy = options.mp_policy();
    if (!policy.cast_forward_inputs() || !policy.param_dtype() || !x.defined() ||
        !x.is_floating_point()) {
      return x;
    }
    return x.to(*policy.param_dtype());
  }
  void before(fsdp::Unit& unit);
  void after(fsdp::Unit& unit, const std::vector<torch::Tensor*>& outputs);
  bool called(const fsdp::Unit* unit) const {
    return std::find(forward_order.begin(), forward_order.end(), unit) != forward_order.end();
  }
  size_t index_of(const fsdp::Unit* unit) const {
    return static_cast<size_t>(std::find(named.begin(), named.end(), unit) - named.begin());
  }

  void add_unit(std::string name, std::vector<torch::Tensor> params,
                std::vector<std::string> names);
  // The pool's slots, once the units are made (Note [Buffers kept from step to step]).
  void reserve_buffers();
  void begin_forward();
  void end_forward(bool grad_enabled);
  // The all-reduce at the end of a forward with gradients: each unit's earliest place among any
  // rank's calls (1-based; 0: none called it), then whether some rank called it with gradients
  // (Note [Units unused on some ranks]).
  std::vector<int32_t> agree_on_usage();
  void plan_backward(const std::vector<int32_t>& agreed);
  // Sets up a backward as planned; `regather`: the units are gathered for it.
  void arm_backward(bool regather);
  // What a backward from `loss` reaches (FullyShardedDataParallel::backward).
  void expect_from(const torch::Tensor& loss);
  void before_backward(fsdp::Unit& unit);
  // The backward's gathers due through `unit` and `ahead` more (those for the others only dropped).
  void gather_backward(const fsdp::Unit& unit, size_t ahead);
  void on_grad_ready(fsdp::Unit& unit, size_t param);
  // Waits for the reduce-scatter in flight, if any.
  void finish_last_reduce();
  // The reduce-scatters whose turn has come, in order.
  void reduce_due();
  void note_backward();
  void reduce(fsdp::Unit& unit);
  void end_backward();
};

void FullyShardedDataParallel::State::add_unit(std::string name, std::vector<torch::Tensor> params,
                                               std::vector<std::string> names) {
  units.push_back(std::make_unique<fsdp::Unit>(
      std::move(name), std::move(params), std::move(names), *group, *reduce_group,
      options.replicate_group().get(), pool, options.init_sync(), options.mp_policy()));
  fsdp::Unit* unit = units.back().get();
  if (!unit->trainable()) return;  // no gradient comes to a frozen unit
  // The hooks after set_data (the Unit's constructor): a change of dtype or device there would
  // give the parameter a new grad accumulator.
  for (size_t i = 0; i < unit->params().size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(unit->params()[i]);
    DDP_CHECK(accumulator != nullptr, "a parameter that requires grad has a grad accumulator");
    hook_keys.push_back(accumulator->add_post_hook(
        std::make_unique<fsdp::AfterAccumulate>([this, unit, i] { on_grad_ready(*unit, i); })));
    accumulated[accumulator.get()] = {unit, i};
    accumulators.push_back(std::move(accumulator));
  }
}

void FullyShardedDataParallel::State::reserve_buffers() {
  const fsdp::Unit* largest = nullptr;
  int64_t reduced = 0;
  for (const auto& unit : units) {
    for (const fsdp::Unit* part : unit->parts()) {
      if (largest == nullptr || part->buffer_bytes() > largest->buffer_bytes()) largest = part;
      reduced = std::max(reduced, part->reduced_bytes());
    }
  }
  if (largest == nullptr) return;
  const int64_t bytes = largest->buffer_bytes();
  // The units gathered at a time (two with prefetch), the root unit's own where it is large
  // enough to take a slot, and the reduce-scatter's output.
  const bool large_root = root != nullptr && 2 * root->buffer_bytes() >= bytes;
  const c10::Device device = largest->shard().device();
  pool.reserve(*group, device, bytes, (options.prefetch() ? 2 : 1) + (large_root ? 1 : 0));
  if (reduced > 0) pool.reserve(*group, device, reduced, 1);
}

void FullyShardedDataParallel::State::begin_forward() {
  forward_order.clear();
  entered = nullptr;
  output_nodes.clear();
  inputs_pending.clear();
  for (auto& unit : units) {
    unit->times() = fsdp::UnitTimes();
    unit->times().name = unit->name();
  }
  // A forward with gradients that no backward followed may have left units gathered (kept after
  // their forward), on the ranks that called them: freed, so that every rank gathers each once.
  for (fsdp::Unit* unit : order) unit->free();
  forward_gathers = fsdp::InOrder(order);
  if (root != nullptr) root->wait_gathered();
}

void FullyShardedDataParallel::State::before(fsdp::Unit& unit) {
  if (called(&unit)) {
    throw InputError(fmt::format(
        "fully_shard: unit {} is called twice in one forward; a unit runs once per forward "
        "(make each use its own unit)",
        unit.name()));
  }
  forward_order.push_back(&unit);
  entered = &unit;
  // Those before it in the order that no call reached yet are gathered too, and kept.
  for (fsdp::Unit* due : forward_gathers.through(&unit)) due->gather_async();
  unit.wait_gathered();
  unit.times().forward_gather = unit.gather_issued();
  unit.times().forward_begin = fsdp::Clock::now();
  if (options.prefetch()) {
    for (fsdp::Unit* next : forward_gathers.through(&unit, 1)) next->gather_async();
  }
}

void FullyShardedDataParallel::State::after(fsdp::Unit& unit,
                                            const std::vector<torch::Tensor*>& outputs) {
  entered = nullptr;
  unit.times().forward_end = fsdp::Clock::now();
  // The unit's backward starts with the first of its outputs' gradients (which one comes first
  // depends on how they are used).
  for (torch::Tensor* output : outputs) {
    if (!output->defined() || !output->requires_grad()) continue;
    output_nodes[&unit].push_back(torch::autograd::impl::gradient_edge(*output).function);
    output->register_hook([this, &unit](const torch::Tensor& grad) {
      before_backward(unit);
      return grad;
    });
  }
  if (options.reshard_after_forward() || !torch::GradMode::is_enabled()) unit.free();
}

torch::Tensor FullyShardedDataParallel::State::watch_input(fsdp::Unit& unit, torch::Tensor x) {
  if (!unit.has_frozen() || !torch::GradMode::is_enabled() || !x.defined() || !x.requires_grad()) {
    return x;
  }
  auto watched = x.view_as(x);
  ++inputs_pending[&unit];
  watched.register_hook([this, &unit](const torch::Tensor& grad) {
    input_grad_arrived(unit);
    return grad;
  });
  return watched;
}

void FullyShardedDataParallel::State::input_grad_arrived(fsdp::Unit& unit) {
  if (--inputs_pending[&unit] > 0 || !options.reshard_after_forward()) return;
  // The unit's backward has run: what it kept gathered for it goes (a frozen-only unit whole).
  if (fsdp::Unit* frozen = unit.frozen_part()) {
    frozen->free();
  } else if (!unit.trainable()) {
    unit.free();
  }
}

void FullyShardedDataParallel::State::end_forward(bool grad_enabled) {
  // The gathers no call reached, for the ranks that call those units (Note [Units unused on some
  // ranks]). Without gradients no backward comes: everything is freed. With them, the units this
  // forward did not call are.
  for (fsdp::Unit* due : forward_gathers.rest()) due->gather_async();
  for (auto& unit : units) {
    if (!grad_enabled || (unit.get() != root && !called(unit.get()))) unit->free();
  }
  if (grad_enabled) plan_backward(agree_on_usage());
}

std::vector<int32_t> FullyShardedDataParallel::State::agree_on_usage() {
  const size_t n = named.size();
  std::vector<int32_t> usage(2 * n, 0);
  if (n == 0) return usage;
  // Each unit's place among this rank's calls as n + 1 - place, so that the maximum over the
  // ranks is its earliest place (0: no rank called it); then whether this rank called it with
  // gradients.
  const auto last = static_cast<int32_t>(n + 1);
  for (size_t p = 0; p < forward_order.size(); ++p) {
    usage[index_of(forward_order[p])] = last - static_cast<int32_t>(p + 1);
  }
  for (const auto& [unit, nodes] : output_nodes) usage[n + index_of(unit)] = 1;
  // On the units' device (NCCL's collectives take CUDA tensors only).
  auto agreed = torch::tensor(usage, torch::kInt32).to(named.front()->shard().device());
  group->all_reduce(agreed, comm::ReduceOp::kMax)->wait();
  // Hybrid sharding: every replica's too, so that the replicas' all-reduces come in one order.
  if (options.replicate_group()) {
    options.replicate_group()->all_reduce(agreed, comm::ReduceOp::kMax)->wait();
  }
  agreed = agreed.cpu();
  std::copy_n(agreed.data_ptr<int32_t>(), usage.size(), usage.begin());
  for (size_t i = 0; i < n; ++i) usage[i] = usage[i] > 0 ? last - usage[i] : 0;
  return usage;
}

void FullyShardedDataParallel::State::plan_backward(const std::vector<int32_t>& agreed) {
  const size_t n = named.size();
  std::vector<size_t> previous;
  for (const fsdp::Unit* unit : order) previous.push_back(index_of(unit));
  order.clear();
  for (size_t i : fsdp::next_gather_order(agreed, previous)) order.push_back(named[i]);
  // The units some rank called with gradients, in the reverse of the forward's order.
  planned_gathers.clear();
  planned_reduces.clear();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (agreed[n + index_of(*it)] != 0) planned_gathers.push_back(*it);
  }
  for (fsdp::Unit* unit : planned_gathers) {
    if (unit->trainable()) planned_reduces.push_back(unit);
  }
  if (root != nullptr && root->trainable()) planned_reduces.push_back(root);
  arm_backward(options.reshard_after_forward());
  planned = true;
}

void FullyShardedDataParallel::State::arm_backward(bool regather) {
  backward_gathers = fsdp::InOrder(regather ? planned_gathers : std::vector<fsdp::Unit*>{});
  reduces = fsdp::InOrder(planned_reduces);
  // This rank's backward: the units it called with gradients, each gradient expected.
  runs_here.clear();
  for (const auto& [unit, nodes] : output_nodes) runs_here.insert(unit);
  for (fsdp::Unit* unit : planned_reduces) {
    const bool here = unit == root || runs_here.count(unit) != 0;
    unit->begin_backward(std::vector<bool>(unit->params().size(), here));
  }
  begun.clear();
  dropped.clear();
}

void FullyShardedDataParallel::State::expect_from(const torch::Tensor& loss) {
  if (!planned) return;  // no forward with gradients before it, or a second backward
  const auto reached = fsdp::reachable_from(loss);
  for (auto it = runs_here.begin(); it != runs_here.end();) {
    bool reaches = false;
    for (const auto& weak : output_nodes[*it]) {
      const auto node = weak.lock();
      reaches = reaches || (node != nullptr && reached.count(node.get()) != 0);
    }
    it = reaches ? std::next(it) : runs_here.erase(it);
  }
  std::map<fsdp::Unit*, std::vector<bool>> expected;
  for (fsdp::Unit* unit : reduces.units()) expected[unit].assign(unit->params().size(), false);
  for (const auto& [node, at] : accumulated) {
    auto it = expected.find(at.first);
    if (it != expected.end() && reached.count(node) != 0) it->second[at.second] = true;
  }
  for (const auto& [unit, marks] : expected) unit->begin_backward(marks);
}

void FullyShardedDataParallel::State::note_backward() {
  if (in_backward) return;
  in_backward = true;
  // A second backward through one forward (retain_graph): the same units again, gathered anew
  // (the first one's end freed them all).
  if (!planned) arm_backward(/*regather=*/true);
  planned = false;
  // Valid only during a backward, hence queued from a hook; it runs when the backward ends.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
}

void FullyShardedDataParallel::State::before_backward(fsdp::Unit& unit) {
  note_backward();
  if (!begun.insert(&unit).second) return;  // a hook of another of its outputs came first
  // The reduce-scatter of the unit after this one is waited for here, not when this unit's ends:
  // its flat gradient gives its slot back to the gather issued next (Note [Buffers kept from step
  // to step]).
  finish_last_reduce();
  for (fsdp::Unit* other : std::exchange(dropped, {})) other->free();
  gather_backward(unit, 0);
  unit.wait_gathered();
  // Gathered again for the backward (not kept since the forward: reshard_after_forward off).
  if (unit.gather_issued() > unit.times().forward_end) {
    unit.times().backward_gather = unit.gather_issued();
  }
  unit.times().backward_begin = fsdp::Clock::now();
  backward_unit = &unit;
  if (options.prefetch()) gather_backward(unit, 1);
}

void FullyShardedDataParallel::State::gather_backward(const fsdp::Unit& unit, size_t ahead) {
  for (fsdp::Unit* due : backward_gathers.through(&unit, ahead)) {
    due->gather_async();
    if (runs_here.count(due) == 0) dropped.push_back(due);
  }
}

void FullyShardedDataParallel::State::finish_last_reduce() {
  if (last_reduced == nullptr) return;
  // The other ranks send theirs once its backward has run there, which may need its gather
  // (issued here only when due otherwise: a unit whose backward this rank does not run).
  gather_backward(*last_reduced, 0);
  std::exchange(last_reduced, nullptr)->finish_reduce();
}

void FullyShardedDataParallel::State::on_grad_ready(fsdp::Unit& unit, size_t param) {
  note_backward();
  if (!unit.in_backward()) {
    throw InputError(fmt::format(
        "fully_shard: parameter {} of unit {} got a gradient after its unit's reduce-scatter: a "
        "second backward through one forward, or a loss that FullyShardedDataParallel::backward "
        "was not given",
        unit.names()[param], unit.name()));
  }
  unit.count_grad(param);
  reduce_due();
}

void FullyShardedDataParallel::State::reduce_due() {
  while (fsdp::Unit* next = reduces.next()) {
    if (!next->gradients_in()) return;
    reduces.pop();
    reduce(*next);
  }
}

void FullyShardedDataParallel::State::reduce(fsdp::Unit& unit) {
  unit.times().backward_end = fsdp::Clock::now();
  finish_last_reduce();
  // The parameters first: the backward is done with them, and the flat gradient takes their place
  // (not the frozen ones: Note [Frozen parameters: freed after the unit's backward]). A unit whose
  // backward did not begin here is left to the end (dropped, or a hook still to come).
  const bool done = &unit == root || begun.count(&unit) != 0;
  if (done && (options.reshard_after_forward() || &unit == root)) unit.free(/*with_frozen=*/false);
  if (!gradient_sync) {
    unit.keep_unreduced();
    return;
  }
  unit.reduce_async();
  last_reduced = &unit;
}

void FullyShardedDataParallel::State::end_backward() {
  // What is not issued yet, in order: the gathers for the other ranks, the reduce-scatters (zeros
  // for the gradients that did not come: Note [Units unused on some ranks]), the root's last.
  for (fsdp::Unit* due : backward_gathers.rest()) due->gather_async();
  while (fsdp::Unit* next = reduces.next()) {
    reduces.pop();
    reduce(*next);
  }
  for (auto& unit : units) {
    unit->finish_reduce();
    unit->free();
  }
  dropped.clear();
  last_reduced = nullptr;
  in_backward = false;
  backward_unit = nullptr;
}

FullyShardedDataParallel::Forward::Forward(FullyShardedDataParallel& model)
    : model_(model), grad_enabled_(torch::GradMode::is_enabled()) {
  if (nn::ForwardHooks::current() != nullptr) {
    throw InputError(
        "fully_shard: a sharded model's forward runs inside another's; shard the "
        "outer model only, with the inner one's blocks among its units");
  }
  model_.state_->begin_forward();
  nn::ForwardHooks::install(model_.state_.get());
}

void FullyShardedDataParallel::Forward::finish() {
  nn::ForwardHooks::install(nullptr);
  finished_ = true;
  model_.state_->end_forward(grad_enabled_);
}

void FullyShardedDataParallel::Forward::fail(const c10::Error& error) {
  const State& state = *model_.state_;
  const std::string what = error.what_without_backtrace();
  std::string message =
      state.entered != nullptr
          ? fmt::format("fully_shard: the forward of unit {} failed: {}", state.entered->name(),
                        what)
          : fmt::format("fully_shard: the sharded model's forward failed: {}", what);
  if (fsdp::reads_parameters_without_data(what)) {
    std::vector<std::string> not_called;
    for (const auto& unit : state.units) {
      const auto& order = state.forward_order;
      if (unit.get() != state.root &&
          std::find(order.begin(), order.end(), unit.get()) == order.end()) {
        not_called.push_back(unit->name());
      }
    }
    message += fmt::format(
        "\n  That is a read of parameters that hold no data: a unit's parameters hold its values "
        "only while its forward runs through ddp::nn::call(unit, ...) (or the Sequential's "
        "forward). Units not called that way in this forward so far: {}",
        not_called.empty() ? std::string("none") : fmt::format("{}", fmt::join(not_called, ", ")));
  }
  throw InputError(message);
}

void FullyShardedDataParallel::backward(const torch::Tensor& loss) {
  state_->expect_from(loss);
  try {
    loss.backward();
  } catch (const c10::Error& error) {
    const fsdp::Unit* unit = std::exchange(state_->backward_unit, nullptr);
    throw InputError(fmt::format(
        "fully_shard: the backward{} failed: {}\n  A unit's backward runs with its parameters "
        "gathered only when its forward ran through ddp::nn::call(unit, ...) (or the Sequential's "
        "forward), once per forward, and the same units ran on every rank",
        unit != nullptr ? fmt::format(" of unit {}", unit->name()) : std::string(),
        error.what_without_backtrace()));
  }
}

FullyShardedDataParallel::Forward::~Forward() {
  nn::ForwardHooks::install(nullptr);
  if (finished_) return;
  try {  // the forward threw: give back what it gathered, and keep its error
    model_.state_->end_forward(/*grad_enabled=*/false);
  } catch (const std::exception&) {
  }
}

FullyShardedDataParallel::FullyShardedDataParallel(
    torch::nn::Sequential module, std::shared_ptr<comm::ProcessGroup> group,
    FullyShardOptions options, std::vector<std::shared_ptr<torch::nn::Module>> units)
    : FullyShardedDataParallel(module.ptr(), units.empty() ? children_of(*module) : units,
                               std::move(group), options) {
  state_->sequential = module;
}

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<torch::nn::Module> module,
    std::vector<std::shared_ptr<torch::nn::Module>> units,
    std::shared_ptr<comm::ProcessGroup> group, FullyShardOptions options)
    : module_(std::move(module)), state_(std::make_unique<State>()) {
  DDP_CHECK(module_ != nullptr && group != nullptr, "fully_shard needs a module and a group");
  state_->group = std::move(group);
  // Note [Units unused on some ranks]: the reduce-scatters on a group of their own (one rank's
  // collectives cannot interleave differently).
  std::vector<int> everyone(static_cast<size_t>(state_->group->world_size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  state_->reduce_group = everyone.size() > 1 ? state_->group->new_group(everyone) : state_->group;
  state_->options = options;
  fsdp::check_batch_norms(*module_, options.mp_policy());
  std::map<const torch::nn::Module*, std::string> module_names;
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) {
    module_names[item.value().get()] = item.key();
  }
  fsdp::Claims claims;
  for (const auto& unit : units) {
    auto it = module_names.find(unit.get());
    if (it == module_names.end()) {
      throw InputError(
          fmt::format("fully_shard: a unit ({}) is not a submodule of the model", unit->name()));
    }
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const auto& item : unit->named_parameters()) {
      const std::string name = it->second + "." + item.key();
      if (claims.claim(item.value(), name, it->second, state_->aliases)) {
        params.push_back(item.value());
        names.push_back(name);
      }
    }
    if (params.empty()) continue;  // nothing to shard: runs as it is (ReLU, Flatten, ...)
    state_->add_unit(it->second, std::move(params), std::move(names));
    state_->by_module[unit.get()] = state_->units.back().get();
  }
  add_root_unit(claims);
  state_->reserve_buffers();
  // Until a forward shows the order, gathers are issued in the order units were given.
  for (const auto& unit : state_->units) {
    if (unit.get() != state_->root) state_->named.push_back(unit.get());
  }
  state_->order = state_->named;
  if (options.init_sync() && options.replicate_group()) {
    broadcast_coalesced(*options.replicate_group(), module_->buffers());
  }
  if (options.init_sync()) broadcast_coalesced(*state_->group, module_->buffers());
}

void FullyShardedDataParallel::add_root_unit(fsdp::Claims& claims) {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module_->named_parameters()) {
    if (claims.claimed_as(item.value(), item.key())) continue;  // a unit's, under this name
    if (claims.claim(item.value(), item.key(), fsdp::kRootUnit, state_->aliases)) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
  }
  if (params.empty()) return;
  state_->add_unit(fsdp::kRootUnit, std::move(params), std::move(names));
  state_->root = state_->units.back().get();
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // The hooks point at the state; the parameters may outlive it.
  for (size_t i = 0; i < state_->accumulators.size(); ++i) {
    state_->accumulators[i]->del_post_hook(state_->hook_keys[i]);
  }
}

torch::Tensor FullyShardedDataParallel::forward(torch::Tensor input) {
  if (!state_->sequential) {
    throw InputError(
        "fully_shard: forward(x) runs a Sequential; call any other model through "
        "forward_with");
  }
  return forward_with(
      [&](torch::Tensor x) { return nn::forward_sequential(**state_->sequential, std::move(x)); },
      input);
}

torch::Tensor FullyShardedDataParallel::cast_input(const torch::Tensor& input) const {
  return state_->cast_input(input);
}

torch::Tensor FullyShardedDataParallel::cast_output(torch::Tensor output) const {
  const auto& dtype = state_->options.mp_policy().output_dtype();
  if (!dtype || !output.is_floating_point()) return output;
  return output.to(*dtype);
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm) {
  std::vector<torch::Tensor> grads;  // the shards' (or their pieces'): the padding's are zeros
  for (const auto& unit : state_->units) {
    for (auto& grad : unit->gradients()) {
      if (grad.defined()) grads.push_back(std::move(grad));
    }
  }
  auto squares = torch::zeros({}, state_->units.front()->shard().options().dtype(torch::kDouble));
  for (const auto& grad : grads) squares += grad.to(torch::kDouble).square().sum();
  state_->group->all_reduce(squares, comm::ReduceOp::kSum)->wait();
  const double norm = std::sqrt(squares.item<double>());
  // torch.nn.utils.clip_grad_norm_'s rule, on the norm over every rank's shards.
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    torch::NoGradGuard no_grad;
    for (const auto& grad : grads) grad.mul_(coefficient);
  }
  return norm;
}

void FullyShardedDataParallel::set_requires_gradient_sync(bool sync) {
  state_->gradient_sync = sync;
}

std::vector<torch::Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<torch::Tensor> shards;
  for (const auto& unit : state_->units) shards.push_back(unit->shard());
  return shards;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::named_parameters()
    const {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& unit : state_->units) {
    if (!unit->trainable()) continue;
    const auto& pieces = unit->pieces();
    for (size_t i = 0; i < pieces.size(); ++i) named.emplace_back(unit->names()[i], pieces[i]);
  }
  return named;
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::state_dict_keys()
    const {
  // The parameters' values are their shards' dtype (the policy's param_dtype is the gathered
  // buffer's, not theirs).
  std::map<std::string, torch::Tensor> meta;
  for (const auto& unit : state_->units) {
    for (const fsdp::Unit* part : unit->parts()) {
      const auto options = part->shard().options().device(torch::kMeta).requires_grad(false);
      for (size_t i = 0; i < part->params().size(); ++i) {
        meta[part->names()[i]] = torch::empty(part->params()[i].sizes(), options);
      }
    }
  }
  for (const auto& [alias, name] : state_->aliases) meta[alias] = meta.at(name);
  // Python's order: each module's parameters, then its buffers, then its children's.
  std::vector<std::pair<std::string, torch::Tensor>> keys;
  std::function<void(const torch::nn::Module&, const std::string&)> add =
      [&](const torch::nn::Module& module, const std::string& prefix) {
        for (const auto& item : module.named_parameters(/*recurse=*/false)) {
          keys.emplace_back(prefix + item.key(), meta.at(prefix + item.key()));
        }
        for (const auto& item : module.named_buffers(/*recurse=*/false)) {
          keys.emplace_back(prefix + item.key(), item.value());
        }
        for (const auto& child : module.named_children()) {
          add(*child.value(), prefix + child.key() + ".");
        }
      };
  add(*module_, "");
  return keys;
}

void FullyShardedDataParallel::gather_each_unit(
    const std::function<void(const std::string& name, const torch::Tensor& value)>& visit) {
  for (auto& unit : state_->units) {
    for (fsdp::Unit* part : unit->parts()) {
      auto copies = part->gather_copies(part->shard());
      for (size_t i = 0; i < copies.size(); ++i) visit(part->names()[i], copies[i]);
    }
  }
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::state_dict() {
  std::map<std::string, torch::Tensor> gathered;
  gather_each_unit(
      [&](const std::string& name, const torch::Tensor& value) { gathered[name] = value; });
  for (const auto& [alias, name] : state_->aliases) gathered[alias] = gathered.at(name);
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& [name, tensor] : state_dict_keys()) {
    auto it = gathered.find(name);
    state.emplace_back(name, it != gathered.end() ? it->second : tensor.detach().clone());
  }
  return state;
}

void FullyShardedDataParallel::load_state_dict(
    const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  auto value_of = [&](const std::string& name, const torch::Tensor& like) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      throw InputError(fmt::format("fully_shard: load_state_dict: missing key {}", name));
    }
    if (it->second.sizes() != like.sizes()) {
      throw InputError(fmt::format("fully_shard: load_state_dict: {} has shape {}, the model's {}",
                                   name, fmt::join(it->second.sizes(), "x"),
                                   fmt::join(like.sizes(), "x")));
    }
    return it->second;
  };
  for (auto& unit : state_->units) {
    for (fsdp::Unit* part : unit->parts()) {
      std::vector<torch::Tensor> values;
      for (size_t i = 0; i < part->params().size(); ++i) {
        values.push_back(value_of(part->names()[i], part->params()[i]));
      }
      part->set_from(values);
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& item : module_->named_buffers()) {
    item.value().copy_(value_of(item.key(), item.value()));
  }
}

std::vector<std::pair<std::string, torch::Tensor>> FullyShardedDataParallel::unshard(
    int unit, const torch::Tensor& shard_like) {
  fsdp::Unit& u = *state_->units.at(static_cast<size_t>(unit));
  auto copies = u.gather_copies(shard_like);
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (size_t i = 0; i < copies.size(); ++i) named.emplace_back(u.names()[i], copies[i]);
  return named;
}

torch::Tensor FullyShardedDataParallel::shard(int unit,
                                              const std::vector<torch::Tensor>& whole) const {
  return state_->units.at(static_cast<size_t>(unit))->part_of(whole);
}

std::vector<std::string> FullyShardedDataParallel::parameter_names(int unit) const {
  return state_->units.at(static_cast<size_t>(unit))->names();
}

std::vector<torch::Tensor> FullyShardedDataParallel::flat_shards() const {
  std::vector<torch::Tensor> shards = parameters();
  for (const auto& unit : state_->units) {
    if (const fsdp::Unit* frozen = unit->frozen_part()) shards.push_back(frozen->shard());
  }
  return shards;
}

std::vector<std::string> FullyShardedDataParallel::flat_shard_names(int shard) const {
  if (shard < num_units()) return parameter_names(shard);
  int frozen_parts = num_units();
  for (const auto& unit : state_->units) {
    const fsdp::Unit* frozen = unit->frozen_part();
    if (frozen != nullptr && frozen_parts++ == shard) return frozen->names();
  }
  throw InputError(fmt::format("fully_shard: no flat shard {}", shard));
}

std::vector<fsdp::UnitTimes> FullyShardedDataParallel::last_iteration() const {
  std::vector<fsdp::UnitTimes> times;
  for (const auto& unit : state_->units) times.push_back(unit->times());
  return times;
}

int FullyShardedDataParallel::num_units() const {
  return static_cast<int>(state_->units.size());
}

int64_t FullyShardedDataParallel::resident_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : state_->units) bytes += unit->resident_bytes();
  return bytes;
}

}  // namespace ddp
