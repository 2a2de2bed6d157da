#include "ddp/core/reducer.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "ddp/common/error.h"
#include "torch_compat.h"

namespace ddp::core {
namespace {

// Runs after the parameter's gradient has been accumulated into .grad (a post hook on its
// AccumulateGrad node; a Tensor hook would run before accumulation).
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Reducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    reducer_->on_grad_ready(index_);
    return outputs;
  }

 private:
  Reducer* reducer_;
  size_t index_;
};

}  // namespace

struct Reducer::Hooks {
  std::vector<compat::GradAccumulator> accumulators;  // kept alive: autograd holds them only weakly
  std::vector<uintptr_t> keys;
};

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      hooks_(std::make_unique<Hooks>()),
      passthrough_(group_->world_size() == 1 && !options_.gradient_as_bucket_view) {
  DDP_CHECK(params_.size() == names_.size(), "one name per parameter");
  allocate_arenas();
  // Gradients arrive roughly in reverse registration order: bucket that way until the first
  // iteration shows the real order.
  assign(reverse_order(params_.size()));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    DDP_CHECK(accumulator != nullptr, "a parameter that requires grad has a grad accumulator");
    hooks_->keys.push_back(accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, i)));
    hooks_->accumulators.push_back(std::move(accumulator));
  }
}

void Reducer::register_comm_hook(CommHookFn hook) {
  DDP_CHECK(hook != nullptr, "register_comm_hook needs a hook");
  if (hook_ || started_) {
    throw Error(fmt::format(
        "rank {}: register_comm_hook: {}; register one hook, once, before the first backward",
        group_->rank(), hook_ ? "a comm hook is registered already" : "training has started"));
  }
  hook_ = std::move(hook);
  passthrough_ = false;  // a hook runs even on one rank (PowerSGD compresses there too)
}

Reducer::~Reducer() {
  // The hooks point at this reducer; the parameters may outlive it.
  for (size_t i = 0; i < hooks_->accumulators.size(); ++i) {
    hooks_->accumulators[i]->del_post_hook(hooks_->keys[i]);
  }
}

void Reducer::assign(std::vector<int64_t> order) {
  order_ = std::move(order);
  const auto assignment = assign_buckets(
      slots_of(params_), {options_.first_bucket_bytes, options_.bucket_cap_bytes}, order_);
  if (assignment.buckets != bucket_indices_) build_buckets(assignment.buckets);
}

void Reducer::set_bucket_cap(size_t bytes) {
  DDP_CHECK(phase_ == Phase::kIdle && !in_backward_, "set_bucket_cap during a backward");
  options_.bucket_cap_bytes = bytes;
  assign(order_);
}

namespace {

// Buckets start on a cache line (the all-reduce's slices are whole lines): at most one bucket
// per parameter, so this much room for padding each.
int64_t line_elements(c10::ScalarType type) {
  return std::max<int64_t>(1, 64 / static_cast<int64_t>(c10::elementSize(type)));
}

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

void Reducer::allocate_arenas() {
  for (const auto& p : params_) {
    auto arena = std::find_if(arenas_.begin(), arenas_.end(), [&](const Arena& a) {
      return a.dtype == p.scalar_type() && a.device == p.device();
    });
    if (arena == arenas_.end()) arena = arenas_.insert(arenas_.end(), {p.scalar_type(), p.device(), {}, 0});
    arena->used += round_up(p.numel(), line_elements(p.scalar_type()));
  }
  // In the order of the parameters, the same on every rank: allocate_buffer is a collective.
  for (auto& arena : arenas_) {
    arena.memory = group_->allocate_buffer(
        arena.used, torch::TensorOptions().dtype(arena.dtype).device(arena.device));
  }
}

torch::Tensor Reducer::carve(const torch::Tensor& like, int64_t numel) {
  auto arena = std::find_if(arenas_.begin(), arenas_.end(), [&](const Arena& a) {
    return a.dtype == like.scalar_type() && a.device == like.device();
  });
  DDP_CHECK(arena != arenas_.end(), "a bucket of a dtype and device the reducer has no arena for");
  auto flat = arena->memory.narrow(0, arena->used, numel);
  arena->used += round_up(numel, line_elements(like.scalar_type()));
  return flat.zero_();
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  // With gradient_as_bucket_view an existing .grad moves into its new slot and stays there; the
  // old slots are in the same arenas, so their values are taken first.
  std::vector<torch::Tensor> grads(params_.size());
  for (size_t i = 0; options_.gradient_as_bucket_view && i < params_.size(); ++i) {
    if (params_[i].grad().defined()) grads[i] = params_[i].grad().clone();
  }
  bucket_indices_ = assignment;
  buckets_.clear();
  for (auto& arena : arenas_) arena.used = 0;
  locator_.assign(params_.size(), {0, 0});
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    bucket.params = assignment[b];
    int64_t total = 0;
    for (size_t i : bucket.params) total += params_[i].numel();
    bucket.flat = carve(params_[bucket.params.front()], total);
    int64_t offset = 0;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket.views.push_back(bucket.flat.narrow(0, offset, params_[i].numel()).view(params_[i].sizes()));
      locator_[i] = {b, k};
      offset += params_[i].numel();
      if (grads[i].defined()) {
        bucket.views.back().copy_(grads[i]);
        params_[i].mutable_grad() = bucket.views.back();
      }
    }
    buckets_.push_back(std::move(bucket));
  }
}

torch::Tensor& Reducer::slot(size_t param) {
  const auto [b, k] = locator_[param];
  return buckets_[b].views[k];
}

void Reducer::begin_iteration() {
  phase_ = Phase::kBackward;
  ready_.assign(params_.size(), false);
  ready_order_.clear();
  next_launch_ = 0;
  started_ = true;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.future.reset();
  }
  stats_ = IterationStats();
  stats_.first_grad = Clock::now();
  stats_.bucket_launch.assign(buckets_.size(), Clock::time_point());
  stats_.bucket_done.assign(buckets_.size(), Clock::time_point());
  stats_.bucket_bytes.assign(buckets_.size(), 0);
  stats_.communicated = !passthrough_;
  if (!static_graph_known()) {
    hooks_left_.assign(params_.size(), 0);  // static_graph's first iteration counts up here
    queue_finalize();
    return;
  }
  hooks_left_ = expected_hooks_;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (expected_hooks_[i] == 0) mark_ready(i);  // no hook will come: zeros, as unused
  }
}

void Reducer::queue_finalize() {
  // Valid only during a backward, hence queued from a hook; it runs when the backward that
  // queued it ends.
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
}

void Reducer::note_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  ++backward_count_;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { in_backward_ = false; });
}

void Reducer::on_grad_ready(size_t index) {
  note_backward();
  if (!require_sync_) return;  // no_sync: accumulate locally
  if (phase_ == Phase::kIdle) begin_iteration();
  if (options_.static_graph) {
    if (!static_graph_known()) {  // the first iteration counts; its finalize reduces everything
      ++hooks_left_[index];
      return;
    }
    if (--hooks_left_[index] > 0) return;  // the parameter is used again later in this backward
  }
  mark_ready(index);
  note_completed();
  launch_ready_buckets();
}

void Reducer::mark_ready(size_t index) {
  if (ready_[index]) {
    throw Error(
        fmt::format("rank {}: parameter '{}' got its gradient twice in one backward{}",
                    group_->rank(), names_[index],
                    options_.static_graph
                        ? ": more often than in the first iteration, so the graph is not static"
                        : "; when a backward runs again inside it (activation checkpointing, a "
                          "block used twice), enable static_graph"));
  }
  ready_[index] = true;
  ready_order_.push_back(static_cast<int64_t>(index));
  stats_.last_grad = Clock::now();
  auto& grad = params_[index].mutable_grad();
  auto& view = slot(index);
  if (passthrough_) {
    // One rank: the average is the gradient itself, already in .grad.
  } else if (!grad.defined()) {
    // An unused parameter contributes zeros, as in c10d's Reducer::mark_variable_ready_dense
    // (torch/csrc/distributed/c10d/reducer.cpp).
    view.zero_();
  } else if (options_.gradient_as_bucket_view) {
    if (!grad.is_alias_of(view)) {  // autograd made a fresh .grad (first use, or set to none)
      view.copy_(grad);
      grad = view;
    }
  } else {
    view.copy_(grad);
  }
  --buckets_[locator_[index].first].pending;
}

void Reducer::launch_ready_buckets() {
  const size_t before = next_launch_;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(next_launch_++);
  // static_graph: the last bucket ends the iteration, on whichever backward launched it.
  if (before < buckets_.size() && next_launch_ == buckets_.size() && static_graph_known()) {
    queue_finalize();
  }
}

void Reducer::note_completed() {
  for (size_t b = 0; b < next_launch_; ++b) {
    if (stats_.bucket_done[b] == Clock::time_point() && buckets_[b].future->is_completed()) {
      stats_.bucket_done[b] = Clock::now();
    }
  }
}

void Reducer::launch(size_t b) {
  auto& bucket = buckets_[b];
  stats_.bucket_launch[b] = Clock::now();
  if (passthrough_) {
    bucket.future = Future::ready(bucket.flat);
    return;
  }
  group_->set_phase(fmt::format("backward: bucket {}", b));  // for the flight recorder
  std::vector<torch::Tensor> params;
  for (size_t i : bucket.params) params.push_back(params_[i]);
  GradBucket view(b, buckets_.size(), bucket.flat, bucket.views, std::move(params));
  const int64_t bytes_before = group_->bytes_issued();
  bucket.future = hook_ ? hook_(view) : allreduce_hook(*group_, view);
  DDP_CHECK(bucket.future != nullptr, "a comm hook returned no future");
  stats_.bucket_bytes[b] += group_->bytes_issued() - bytes_before;
}

void Reducer::wait_for(size_t b) {
  auto& bucket = buckets_[b];
  group_->set_phase(fmt::format("backward: bucket {}", b));  // continuations may communicate
  const int64_t bytes_before = group_->bytes_issued();
  const auto reduced = bucket.future->wait();
  stats_.bucket_bytes[b] += group_->bytes_issued() - bytes_before;
  if (stats_.bucket_done[b] == Clock::time_point()) stats_.bucket_done[b] = Clock::now();
  if (!reduced.is_same(bucket.flat)) {
    if (!reduced.defined() || reduced.numel() != bucket.flat.numel()) {
      throw Error(fmt::format(
          "rank {}: the comm hook's future for bucket {} holds {} elements; the bucket has {}",
          group_->rank(), b, reduced.defined() ? reduced.numel() : 0, bucket.flat.numel()));
    }
    bucket.flat.copy_(reduced.view({-1}));
  }
}

void Reducer::report_unready() const {
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) missing.push_back(fmt::format("'{}'", names_[i]));
  }
  const size_t shown = std::min<size_t>(missing.size(), 10);
  throw InputError(fmt::format(
      "rank {}: {} parameter(s) got no gradient in this iteration: {}{}. Their buckets cannot be "
      "reduced. If the model has parameters that take no part in the loss, enable "
      "find_unused_parameters (ddp_train: --find-unused-parameters)",
      group_->rank(), missing.size(),
      fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      missing.size() > shown ? ", ..." : ""));
}

void Reducer::finalize() {
  if (phase_ != Phase::kBackward) return;
  phase_ = Phase::kIdle;  // first: a failure below must not leave the reducer mid-iteration
  stats_.finalize_start = Clock::now();
  const bool static_first = options_.static_graph && !static_graph_known();
  // find_unused_parameters and static_graph's first iteration: how many ranks used each
  // parameter (static_graph: used at the first iteration, where the hooks only counted).
  std::vector<int32_t> used = options_.static_graph ? static_used_ : std::vector<int32_t>();
  if (options_.find_unused_parameters || static_first) {
    used.assign(params_.size(), 0);
    for (size_t i = 0; i < params_.size(); ++i)
      used[i] = static_first ? hooks_left_[i] > 0 : ready_[i];
    for (const auto& bucket_params : bucket_indices_) {
      for (size_t i : bucket_params) {
        if (!ready_[i]) mark_ready(i);
      }
    }
    launch_ready_buckets();
    reduce_used_map(used);  // after the buckets: same order everywhere
  } else if (next_launch_ < buckets_.size()) {
    report_unready();
  }

  note_completed();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    wait_for(b);
    buckets_[b].future.reset();
    if (!passthrough_) finalize_bucket(buckets_[b], used);
  }
  stats_.finalize_end = Clock::now();
  if (static_first) {
    expected_hooks_ = hooks_left_;
    static_used_ = used;
  }
  // Static graph: from the second iteration's order, the first's marks are in bucket order.
  if (!rebuilt_ && !options_.find_unused_parameters && !static_first) {
    rebuild_from_observed_order();
  }
}

void Reducer::finalize_bucket(const Bucket& bucket, const std::vector<int32_t>& used) {
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const size_t i = bucket.params[k];
    // A parameter no rank used keeps its .grad as it was, as c10d's
    // Reducer::finalize_bucket_dense does ("globally unused" parameters).
    if (!used.empty() && used[i] == 0) continue;
    auto& grad = params_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      grad = bucket.views[k];
    } else if (grad.defined()) {
      grad.copy_(bucket.views[k]);
    } else {
      grad = bucket.views[k].clone();
    }
  }
}

void Reducer::reduce_used_map(std::vector<int32_t>& used) {
  auto used_map = torch::tensor(used, torch::kInt).to(params_.front().device());
  group_->set_phase("backward: unused-parameter map");
  group_->all_reduce(used_map, comm::ReduceOp::kSum)->wait();
  used_map = used_map.cpu();
  used.assign(used_map.data_ptr<int32_t>(), used_map.data_ptr<int32_t>() + used_map.numel());
}

void Reducer::join_backward() {
  DDP_CHECK(phase_ == Phase::kIdle, "join_backward outside a backward");
  if (passthrough_) return;  // one rank: a backward issues no collective either
  const bool static_first = options_.static_graph && !static_graph_known();
  stats_ = IterationStats();
  stats_.bucket_launch.assign(buckets_.size(), Clock::time_point());
  stats_.bucket_done.assign(buckets_.size(), Clock::time_point());
  stats_.bucket_bytes.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].flat.zero_();
    launch(b);
  }
  if (options_.find_unused_parameters || static_first) {
    std::vector<int32_t> used(params_.size(), 0);  // this rank used nothing
    reduce_used_map(used);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    wait_for(b);
    buckets_[b].future.reset();
  }
  // The training ranks rebuild after their first synchronised backward: mirror it, offering
  // the current order (only rank 0's counts).
  if (!rebuilt_ && !options_.find_unused_parameters && !options_.static_graph) {
    ready_order_.clear();
    for (const auto& bucket : bucket_indices_) {
      for (size_t i : bucket) ready_order_.push_back(static_cast<int64_t>(i));
    }
    rebuild_from_observed_order();
  }
}

void Reducer::rebuild_from_observed_order() {
  rebuilt_ = true;
  // Ranks agree on rank 0's order (one broadcast, on every rank, once).
  auto order = torch::tensor(ready_order_, torch::kLong).to(params_.front().device());
  group_->broadcast(order, 0)->wait();
  order = order.cpu();
  assign(
      std::vector<int64_t>(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + order.numel()));
}

}  // namespace ddp::core
