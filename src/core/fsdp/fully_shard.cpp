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
#include <optional>
#include <set>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
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

// The units and what one iteration has done with them. Unit by unit:
//   forward:  before() waits for the unit's gather and issues the next one's; after() arranges the
//             gather for the backward on the output (a tensor hook) and frees the unit.
//   backward: the output's hook waits for the unit's gather, starts counting its gradients and
//             issues the gather of the unit before it; when the unit's last parameter has its
//             gradient, the unit is freed and its reduce-scatter issued (after the previous
//             unit's has finished, so that one flat gradient is in flight at a time); at the end
//             of the backward (autograd's callback) the rest is reduced, waited for and freed.
struct FullyShardedDataParallel::State : nn::ForwardHooks {
  std::shared_ptr<comm::ProcessGroup> group;
  FullyShardOptions options;
  fsdp::BufferPool pool;  // before the units, which give their buffers back to it
  std::optional<torch::nn::Sequential> sequential;
  std::vector<std::unique_ptr<fsdp::Unit>> units;  // the named units in order, the root last
  fsdp::Unit* root = nullptr;
  std::map<const torch::nn::Module*, fsdp::Unit*> by_module;
  std::map<std::string, std::string> aliases;  // a tied parameter's other names: the unit's name
  std::vector<compat::GradAccumulator> accumulators;  // kept alive: autograd holds them weakly
  std::vector<uintptr_t> hook_keys;

  // This iteration's.
  std::vector<fsdp::Unit*> forward_order;  // units as this forward called them
  std::vector<fsdp::Unit*> predicted;      // the last forward's order: whose gather to issue next
  fsdp::Unit* entered = nullptr;           // whose forward runs now (before() without after())
  std::map<fsdp::Unit*, int> inputs_pending;  // input gradients still to come, per unit
  bool gradient_sync = true;                  // set_requires_gradient_sync
  fsdp::Unit* last_reduced = nullptr;         // whose reduce-scatter is in flight
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

  void add_unit(std::string name, std::vector<torch::Tensor> params,
                std::vector<std::string> names);
  // The pool's slots, once the units are made (Note [Buffers kept from step to step]).
  void reserve_buffers();
  void begin_forward();
  void end_forward(bool grad_enabled);
  void before_backward(fsdp::Unit& unit);
  void on_grad_ready(fsdp::Unit& unit, size_t param);
  void note_backward();
  void reduce(fsdp::Unit& unit);
  void end_backward();
  // The unit after (+1) or before (-1) `unit` in the order forwards go.
  fsdp::Unit* neighbour(const fsdp::Unit& unit, int step) const;
};

void FullyShardedDataParallel::State::add_unit(std::string name, std::vector<torch::Tensor> params,
                                               std::vector<std::string> names) {
  units.push_back(std::make_unique<fsdp::Unit>(std::move(name), std::move(params), std::move(names),
                                               *group, pool, options.init_sync(),
                                               options.mp_policy()));
  fsdp::Unit* unit = units.back().get();
  if (!unit->trainable()) return;  // no gradient comes to a frozen unit
  // The hooks after set_data (the Unit's constructor): a change of dtype or device there would
  // give the parameter a new grad accumulator.
  for (size_t i = 0; i < unit->params().size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(unit->params()[i]);
    DDP_CHECK(accumulator != nullptr, "a parameter that requires grad has a grad accumulator");
    hook_keys.push_back(accumulator->add_post_hook(
        std::make_unique<fsdp::AfterAccumulate>([this, unit, i] { on_grad_ready(*unit, i); })));
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

fsdp::Unit* FullyShardedDataParallel::State::neighbour(const fsdp::Unit& unit, int step) const {
  const auto& order = predicted;
  auto it = std::find(order.begin(), order.end(), &unit);
  if (it == order.end()) return nullptr;
  const auto at = (it - order.begin()) + step;
  if (at < 0 || at >= static_cast<std::ptrdiff_t>(order.size())) return nullptr;
  return order[at];
}

void FullyShardedDataParallel::State::begin_forward() {
  forward_order.clear();
  entered = nullptr;
  inputs_pending.clear();
  for (auto& unit : units) {
    unit->times() = fsdp::UnitTimes();
    unit->times().name = unit->name();
  }
  if (root == nullptr) return;
  root->wait_gathered();
  if (torch::GradMode::is_enabled()) root->begin_backward();
}

void FullyShardedDataParallel::State::before(fsdp::Unit& unit) {
  if (std::find(forward_order.begin(), forward_order.end(), &unit) != forward_order.end()) {
    throw InputError(fmt::format(
        "fully_shard: unit {} is called twice in one forward; a unit runs once per forward "
        "(make each use its own unit)",
        unit.name()));
  }
  forward_order.push_back(&unit);
  entered = &unit;
  unit.wait_gathered();  // issued by the unit before's prefetch, or now
  unit.times().forward_gather = unit.gather_issued();
  unit.times().forward_begin = fsdp::Clock::now();
  if (options.prefetch()) {
    if (fsdp::Unit* next = neighbour(unit, +1)) next->gather_async();
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
  // Without gradients no backward comes: everything is freed. With them, the gathers issued for a
  // unit this forward did not call (a prediction it did not follow) are.
  for (auto& unit : units) {
    const bool used = unit.get() == root || std::find(forward_order.begin(), forward_order.end(),
                                                      unit.get()) != forward_order.end();
    if (!grad_enabled || !used) unit->free();
  }
  predicted = forward_order;
}

void FullyShardedDataParallel::State::note_backward() {
  if (in_backward) return;
  in_backward = true;
  // Valid only during a backward, hence queued from a hook; it runs when the backward ends.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
}

void FullyShardedDataParallel::State::before_backward(fsdp::Unit& unit) {
  if (unit.in_backward()) return;  // a hook of another of its outputs came first
  note_backward();
  // The reduce-scatter of the unit after this one is waited for here, not when this unit's ends:
  // its flat gradient gives its slot back to the gather issued next (Note [Buffers kept from step
  // to step]).
  if (last_reduced != nullptr) std::exchange(last_reduced, nullptr)->finish_reduce();
  unit.wait_gathered();
  // Gathered again for the backward (not kept since the forward: reshard_after_forward off).
  if (unit.gather_issued() > unit.times().forward_end) {
    unit.times().backward_gather = unit.gather_issued();
  }
  unit.times().backward_begin = fsdp::Clock::now();
  backward_unit = &unit;
  unit.begin_backward();
  if (options.prefetch()) {
    if (fsdp::Unit* next = neighbour(unit, -1)) next->gather_async();
  }
}

void FullyShardedDataParallel::State::on_grad_ready(fsdp::Unit& unit, size_t param) {
  note_backward();
  if (unit.count_grad(param)) reduce(unit);
}

void FullyShardedDataParallel::State::reduce(fsdp::Unit& unit) {
  unit.times().backward_end = fsdp::Clock::now();
  if (last_reduced != nullptr) last_reduced->finish_reduce();
  // The parameters first: the backward is done with them, and the flat gradient takes their place
  // (not the frozen ones: Note [Frozen parameters: freed after the unit's backward]).
  if (options.reshard_after_forward() || &unit == root) unit.free(/*with_frozen=*/false);
  if (!gradient_sync) {
    unit.keep_unreduced();
    return;
  }
  unit.reduce_async();
  last_reduced = &unit;
}

void FullyShardedDataParallel::State::end_backward() {
  // Units whose parameters did not all get gradients: reduced with zeros for the missing ones, in
  // the reverse of the forward's order (the same on every rank: Note [Same graph on every rank]),
  // the root last.
  for (auto it = forward_order.rbegin(); it != forward_order.rend(); ++it) {
    if ((*it)->in_backward()) reduce(**it);
  }
  if (root != nullptr && root->in_backward()) reduce(*root);
  for (auto& unit : units) {
    unit->finish_reduce();
    unit->free();
  }
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
  // Until a forward shows the order, gathers are issued ahead in the order units were given.
  for (const auto& unit : state_->units) {
    if (unit.get() != state_->root) state_->predicted.push_back(unit.get());
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
