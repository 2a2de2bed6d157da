#include "unit.h"

#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <tuple>

#include "ddp/common/error.h"
#include "torch_compat.h"

namespace ddp::fsdp {
namespace {

// Points `t`'s storage at `memory`'s bytes (undefined: none), keeping the StorageImpl, so that
// every view of it sees them (Note [Parameters are views of the gathered buffer]). The storage does
// not own them: `memory` (a slot of the pool, or memory of its own) is kept by the unit.
void point_storage(const torch::Tensor& t, const torch::Tensor& memory) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      c10::DataPtr(memory.defined() ? memory.data_ptr() : nullptr, t.device()));
  storage->set_nbytes(memory.defined() ? memory.nbytes() : 0);
}

// Adds `value` into `leaf`'s gradient, or makes it a copy of it (in the leaf's dtype: `value` is
// the pool's reduce-scatter output, Note [Buffers kept from step to step]).
void add_gradient(const torch::Tensor& leaf, const torch::Tensor& value) {
  auto& grad = leaf.mutable_grad();
  if (grad.defined()) {
    grad.add_(value);
  } else {
    grad = value.to(leaf.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
}

void check_params(const std::string& unit, const std::vector<torch::Tensor>& params,
                  const std::vector<std::string>& names) {
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const auto& first = params.front();
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device() ||
        !torch::isFloatingType(p.scalar_type())) {
      throw InputError(fmt::format(
          "fully_shard: unit {} mixes parameters of {} on {} ({}) and {} on {} ({}); a unit's "
          "parameters share one floating dtype and one device",
          unit, names.front(), first.device().str(), comm::dtype_name(first.scalar_type()),
          names[i], p.device().str(), comm::dtype_name(p.scalar_type())));
    }
  }
}

// Labels the collectives `group` issues during its life "<the step's phase>: <what>" (the flight
// recorder's phase, which the hang report and the overlap test read; the step's is `step`'s, the
// model's group, which the trainer labels), then gives `group` its phase back.
class Label {
 public:
  Label(comm::ProcessGroup& group, const char* what, const std::string& unit,
        const comm::ProcessGroup& step)
      : group_(group), phase_(group.recorder().phase()) {
    group_.set_phase(fmt::format("{}: {} {}", step.recorder().phase(), what, unit));
  }
  ~Label() { group_.set_phase(phase_); }
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  comm::ProcessGroup& group_;
  std::string phase_;
};

}  // namespace

FlatLayout plan_flat_layout(const std::vector<int64_t>& numels, int world_size) {
  DDP_CHECK(world_size > 0, "a world of at least one rank");
  FlatLayout layout;
  for (int64_t n : numels) {
    layout.offsets.push_back(layout.numel);
    layout.numel += n;
  }
  layout.shard = (layout.numel + world_size - 1) / world_size;
  layout.padded = layout.shard * world_size;
  return layout;
}

Unit::Unit(std::string name, std::vector<torch::Tensor> params, std::vector<std::string> names,
           comm::ProcessGroup& group, comm::ProcessGroup& reduce_group,
           comm::ProcessGroup* replicate, BufferPool& pool, bool init_sync,
           const MixedPrecisionPolicy& policy)
    : name_(std::move(name)),
      group_(group),
      reduce_group_(reduce_group),
      replicate_(replicate),
      pool_(pool) {
  times_.name = name_;
  DDP_CHECK(!params.empty() && params.size() == names.size(), "a unit has named parameters");
  check_params(name_, params, names);
  // Note [Frozen parameters: a flat buffer of their own]
  std::vector<torch::Tensor> frozen;
  std::vector<std::string> frozen_names;
  for (size_t i = 0; i < params.size(); ++i) {
    auto [to, to_names] =
        params[i].requires_grad() ? std::tie(params_, names_) : std::tie(frozen, frozen_names);
    to.push_back(params[i]);
    to_names.push_back(names[i]);
  }
  if (params_.empty()) {
    params_ = std::move(frozen);
    names_ = std::move(frozen_names);
  } else if (!frozen.empty()) {
    frozen_ = std::make_unique<Unit>(name_, std::move(frozen), std::move(frozen_names), group_,
                                     reduce_group_, replicate_, pool_, init_sync, policy);
  }
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  layout_ = plan_flat_layout(numels, group_.world_size());
  torch::NoGradGuard no_grad;
  full_ = flatten(params_);
  if (init_sync && replicate_ != nullptr) replicate_->broadcast(full_, 0)->wait();
  if (init_sync) group_.broadcast(full_, 0)->wait();
  shard_ = full_.narrow(0, group_.rank() * layout_.shard, layout_.shard).clone();
  shard_.set_requires_grad(params_.front().requires_grad());
  const auto param_dtype = policy.param_dtype().value_or(shard_.scalar_type());
  reduce_dtype_ = policy.reduce_dtype().value_or(param_dtype);
  if (param_dtype != full_.scalar_type()) full_ = full_.to(param_dtype);
  make_views();
  show_parameters(true);
  grad_seen_.assign(params_.size(), false);
  free();
}

void Unit::make_views() {
  for (size_t i = 0; i < params_.size(); ++i) {
    views_.push_back(
        full_.narrow(0, layout_.offsets[i], params_[i].numel()).view(params_[i].sizes()));
    no_data_.push_back(compat::storageless_like(
        views_.back(),
        fmt::format("fully_shard: parameter {} of unit {} holds no data while the unit is not "
                    "gathered: a unit's forward runs through ddp::nn::call(unit, ...) inside the "
                    "sharded model's forward, and FullyShardedDataParallel::state_dict() gives "
                    "the model's values",
                    names_[i], name_)));
  }
}

void Unit::show_parameters(bool gathered) {
  const auto& shown = gathered ? views_ : no_data_;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].set_data(shown[i]);
}

torch::Tensor Unit::flatten(const std::vector<torch::Tensor>& values) const {
  auto flat = torch::zeros({layout_.padded}, params_.front().options().requires_grad(false));
  for (size_t i = 0; i < values.size(); ++i) {
    flat.narrow(0, layout_.offsets[i], values[i].numel()).copy_(values[i].detach().reshape(-1));
  }
  return flat;
}

void Unit::gather_async() {
  if (frozen_) frozen_->gather_async();
  if (full_state_ != FullState::kFreed) return;
  // Note [Buffers kept from step to step]
  memory_ = pool_.take(layout_.padded, full_.options());
  point_storage(full_, memory_);
  const Label label(group_, "gather", name_, group_);
  gather_issued_ = Clock::now();
  // Note [Mixed precision: the gathered buffer in param_dtype]
  sent_ = shard_.detach().to(full_.scalar_type());
  gather_work_ = group_.all_gather(full_, sent_);
  full_state_ = FullState::kGathering;
}

void Unit::wait_gathered() {
  gather_async();
  if (frozen_) frozen_->wait_gathered();
  wait_own_gather();
}

void Unit::wait_own_gather() {
  if (full_state_ == FullState::kGathering) {
    gather_work_->wait();
    gather_work_.reset();
    sent_ = torch::Tensor();
    full_state_ = FullState::kGathered;
    show_parameters(true);
  }
}

void Unit::free(bool with_frozen) {
  if (frozen_ && with_frozen) frozen_->free();
  if (full_state_ == FullState::kFreed) return;
  wait_own_gather();  // never give back memory a collective still writes
  show_parameters(false);
  point_storage(full_, torch::Tensor());
  memory_ = torch::Tensor();  // back to the pool
  full_state_ = FullState::kFreed;
}

void Unit::begin_backward(const std::vector<bool>& expected) {
  if (!trainable()) return;  // nothing of a frozen unit is reduced
  DDP_CHECK(expected.size() == params_.size(), "a mark per parameter");
  in_backward_ = true;
  grads_left_ = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    grad_seen_[i] = !expected[i];  // a gradient not expected counts for nothing
    grads_left_ += expected[i] ? 1 : 0;
  }
}

bool Unit::count_grad(size_t index) {
  if (grad_seen_[index]) return false;  // a second backward through it before the reduce
  grad_seen_[index] = true;
  return --grads_left_ == 0;
}

torch::Tensor Unit::take_gradients() {
  DDP_CHECK(in_backward_ && reduce_work_ == nullptr, "one reduce per backward through the unit");
  in_backward_ = false;
  // The gradients autograd left in .grad (zeros where none came), flattened as the parameters
  // lie in the gathered buffer (in a slot of the pool: Note [Buffers kept from step to step]),
  // then dropped: the two copies live together only here.
  const bool adding = kept_.defined();
  torch::Tensor flat =
      adding ? std::move(kept_) : pool_.take(layout_.padded, full_.options().dtype(reduce_dtype_));
  kept_ = torch::Tensor();
  torch::NoGradGuard no_grad;
  if (!adding) flat.narrow(0, layout_.numel, layout_.padded - layout_.numel).zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    auto place = flat.narrow(0, layout_.offsets[i], params_[i].numel());
    if (grad.defined()) {
      adding ? place.add_(grad.reshape(-1)) : place.copy_(grad.reshape(-1));
    } else if (!adding) {
      place.zero_();
    }
    grad = torch::Tensor();
  }
  return flat;
}

void Unit::keep_unreduced() {
  kept_ = take_gradients();
}

void Unit::reduce_async() {
  flat_grad_ = take_gradients();
  reduced_ = pool_.take(layout_.shard, flat_grad_.options());
  const Label label(reduce_group_, "reduce-scatter", name_, group_);
  reduce_work_ = reduce_group_.reduce_scatter(reduced_, flat_grad_, comm::ReduceOp::kAvg);
}

void Unit::finish_reduce() {
  if (reduce_work_ == nullptr) return;
  reduce_work_->wait();
  times_.reduce_done = Clock::now();
  reduce_work_.reset();
  flat_grad_ = torch::Tensor();
  if (replicate_ != nullptr) {  // hybrid sharding: the same shard's average over the replicas
    const Label label(*replicate_, "all-reduce across replicas", name_, group_);
    replicate_->all_reduce(reduced_, comm::ReduceOp::kAvg)->wait();
  }
  torch::NoGradGuard no_grad;
  if (!pieces_.empty()) {  // Note [Per-parameter views of the shard]
    for (size_t i = 0; i < pieces_.size(); ++i) {
      add_gradient(pieces_[i], reduced_.narrow(0, piece_begins_[i], pieces_[i].numel()));
    }
  } else {
    add_gradient(shard_, reduced_);
  }
  reduced_ = torch::Tensor();
}

std::vector<torch::Tensor> Unit::gradients() const {
  if (pieces_.empty()) return {shard_.grad()};
  std::vector<torch::Tensor> grads;
  for (const auto& piece : pieces_) grads.push_back(piece.grad());
  return grads;
}

const std::vector<torch::Tensor>& Unit::pieces() const {
  if (!pieces_.empty() || !trainable()) return pieces_;
  const int64_t begin = group_.rank() * layout_.shard, end = begin + layout_.shard;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t first = std::clamp(layout_.offsets[i], begin, end);
    const int64_t last = std::clamp(layout_.offsets[i] + params_[i].numel(), begin, end);
    // A leaf of its own (not a view autograd tracks) whose data is the shard's elements: the
    // optimizer's in-place updates are the shard's.
    auto piece = torch::empty({0}, shard_.options().requires_grad(false));
    piece.set_data(shard_.detach().narrow(0, first - begin, last - first));
    piece.set_requires_grad(true);
    pieces_.push_back(piece);
    piece_begins_.push_back(first - begin);
  }
  return pieces_;
}

std::vector<torch::Tensor> Unit::gather_copies(const torch::Tensor& shard_like) {
  DDP_CHECK(shard_like.numel() == layout_.shard, "a tensor laid out as the shard");
  // In a slot of the pool where one is free (outside a step: a checkpoint's gathers), so that
  // only the copies are new memory.
  auto whole = pool_.take(layout_.padded, shard_like.options().requires_grad(false));
  group_.all_gather(whole, shard_like.detach().contiguous())->wait();
  std::vector<torch::Tensor> copies;
  for (size_t i = 0; i < params_.size(); ++i) {
    copies.push_back(
        whole.narrow(0, layout_.offsets[i], params_[i].numel()).view(params_[i].sizes()).clone());
  }
  return copies;
}

torch::Tensor Unit::part_of(const std::vector<torch::Tensor>& values) const {
  // Only the elements inside this rank's range of the flat buffer are read: a value may be a
  // view of a mapped file (read_pt_file), of which only what is read comes into memory.
  torch::NoGradGuard no_grad;
  auto part = torch::zeros({layout_.shard}, values.front().options().requires_grad(false));
  const int64_t begin = group_.rank() * layout_.shard, end = begin + layout_.shard;
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t first = std::max(begin, layout_.offsets[i]);
    const int64_t last = std::min(end, layout_.offsets[i] + values[i].numel());
    if (first >= last) continue;
    part.narrow(0, first - begin, last - first)
        .copy_(values[i].detach().reshape(-1).narrow(0, first - layout_.offsets[i], last - first));
  }
  return part;
}

void Unit::set_from(const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  shard_.copy_(part_of(values));
  if (full_state_ != FullState::kFreed) {  // a gathered unit shows the new values too
    wait_gathered();
    for (size_t i = 0; i < params_.size(); ++i) {
      full_.narrow(0, layout_.offsets[i], params_[i].numel()).copy_(values[i].reshape(-1));
    }
  }
}

int64_t Unit::buffer_bytes() const {
  const size_t widest =
      std::max(static_cast<size_t>(full_.element_size()), c10::elementSize(reduce_dtype_));
  return layout_.padded * static_cast<int64_t>(widest);
}

int64_t Unit::reduced_bytes() const {
  return trainable() ? layout_.shard * static_cast<int64_t>(c10::elementSize(reduce_dtype_)) : 0;
}

int64_t Unit::resident_bytes() const {
  return static_cast<int64_t>(shard_.nbytes() + full_.storage().nbytes()) +
         (frozen_ ? frozen_->resident_bytes() : 0);
}

}  // namespace ddp::fsdp
