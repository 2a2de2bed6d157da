#pragma once
// One unit of a sharded model (fully_shard.h): its parameters as one flat buffer, of which this
// rank keeps one shard and which is whole only between a gather and a free. A private header of
// src/core/fsdp.
//
// Note [Parameters are views of the gathered buffer]
// While the unit is gathered, each parameter of the unit is (set_data) a view of its place in
// `full_`, the buffer the all-gather fills. A gather points full_'s storage at memory taken from
// the pool (Note [Buffers kept from step to step] in buffer_pool.h); freeing points it at nothing
// (its size set to 0) and gives the memory back: the views autograd saved of the parameters in
// the forward (a Linear's weight.t()) keep the same storage and read it again once a gather has
// filled it anew. The collectives write the
// storage directly, so the parameters' version counters do not move and autograd's saved tensors
// stay valid.
//
// Note [Parameters hold no data while the unit is not gathered]
// From the free to the next gather's completion each parameter is (set_data) a tensor of its
// shape without storage (compat::storageless_like): any read of it (a unit called without
// ddp::nn::call, so never gathered; weight.norm() between steps; torch::save of the module)
// throws LibTorch's error, which says so and names the parameter where the release can. Without
// this, such a read got freed memory (a segfault) or, while a prefetched gather was still writing
// the buffer, silently wrong values. autograd saves a leaf parameter as itself, so the backward
// reads the parameter again once before_backward has gathered the unit. set_data keeps the dtype
// and device, so the parameters' grad accumulators (and their hooks) stay. The gradients are the
// parameters' .grad as autograd leaves them; once the unit's last one is in, they are copied into a
// flat buffer laid out as `full_` is, which the reduce-scatter reads whole.
//
// Note [Mixed precision: the gathered buffer in param_dtype]
// Under a mixed precision policy, `full_` has the policy's param_dtype and the shard the
// parameters' own: a gather sends a copy of the shard cast to param_dtype, so the parameters
// (views of `full_`) and their gradients are in param_dtype; the flat gradient and the
// reduce-scatter are in reduce_dtype, and its result is cast to the shard's dtype as it is added
// into the shard's .grad. The optimizer never sees anything but the shard's dtype.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "buffer_pool.h"
#include "ddp/comm/process_group.h"
#include "ddp/core/fully_shard.h"

namespace ddp::fsdp {

// Note [Frozen parameters: a flat buffer of their own]
// A unit's parameters that do not require grad (a frozen base under trainable adapters) are
// flattened apart from the trainable ones, into a second Unit the first owns (`frozen_part()`):
// gathered and freed with it, never counted, reduced or given a gradient, so the reduce-scatter
// and the flat gradient hold the trainable parameters only. A unit with no trainable parameter is
// a frozen Unit itself; its shard, which does not require grad, still takes its place in
// parameters() (optimizers skip a tensor without a gradient).
//
// Note [Frozen parameters: freed after the unit's backward]
// A trainable parameter's last gradient is accumulated after every node of the backward that
// reads it has run, so the unit's trainable buffer can go when that gradient comes. Nothing
// signals that of a frozen parameter: the node that computes the input's gradient through a
// frozen weight may run after the trainable ones' last gradient (which depends on the order the
// forward made the nodes in). So the frozen part is freed when the gradients of the unit's inputs
// have all arrived (each a hook on a view of the input, as FSDP2's post-backward hook on the
// inputs), or at the end of the backward (an input that does not require grad, the root unit).
//
// Note [Per-parameter views of the shard]
// An optimizer with per-parameter options (weight decay off for biases) needs the parameters, not
// one flat shard per unit. pieces() gives, as FSDP1's use_orig_params, each parameter's part of
// this rank's shard: the elements of its range in the flat buffer that fall in the shard, a 1-D
// tensor whose data is the shard's (set_data of a narrow of it), a leaf of its own, so that the
// optimizer's in-place steps are the shard's and its state is per parameter. Once they are made,
// each reduce adds into the pieces' own .grad, not the shard's: the gradients are the optimizer's
// leaves', so that its zero_grad (in place on 1.13, which cannot detach a view; to none on 2.x)
// acts on them. clip_grad_norm scales whichever holds them (gradients()).
class Unit {
 public:
  // `params` (the module's own tensors) with their names in the model; `name` says which unit in
  // errors. With `init_sync`, rank 0's values are broadcast first (a collective); `policy`'s
  // param_dtype and reduce_dtype apply. The gathers go on `group`, the reduce-scatters on
  // `reduce_group` (Note [Units unused on some ranks] in in_order.h; the same group will do), and
  // with `replicate` (may be null: FullyShardOptions::replicate_group) each reduced shard is then
  // averaged over it (and init_sync broadcasts over it first). The gathered buffer and the flat
  // gradient come from `pool` (which outlives the unit). Throws InputError for parameters that mix
  // dtypes or devices.
  Unit(std::string name, std::vector<torch::Tensor> params, std::vector<std::string> names,
       comm::ProcessGroup& group, comm::ProcessGroup& reduce_group, comm::ProcessGroup* replicate,
       BufferPool& pool, bool init_sync, const MixedPrecisionPolicy& policy = {});
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const std::string& name() const { return name_; }
  // The parameters laid out in this unit's flat buffer: the trainable ones (all of them frozen for
  // a unit without a trainable one), and their names.
  const std::vector<torch::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  bool trainable() const { return shard_.requires_grad(); }
  // The unit's frozen parameters when it has trainable ones too (nullptr: none).
  const Unit* frozen_part() const { return frozen_.get(); }
  Unit* frozen_part() { return frozen_.get(); }
  // The unit's flat buffers: itself, and its frozen part when it has one.
  std::vector<Unit*> parts() {
    if (frozen_) return {this, frozen_.get()};
    return {this};
  }
  const torch::Tensor& shard() const { return shard_; }
  // Note [Per-parameter views of the shard]
  // This rank's part of each parameter (in params() order): a 1-D leaf viewing the shard, made at
  // the first call; once made, each reduce adds into their .grad instead of the shard's.
  const std::vector<torch::Tensor>& pieces() const;
  // The gradients the reduces add into: the shard's, or the pieces' once made (undefined ones
  // included).
  std::vector<torch::Tensor> gradients() const;
  const FlatLayout& layout() const { return layout_; }
  // This iteration's times (the orchestrator fills them; the gathers' issue times are the unit's).
  UnitTimes& times() { return times_; }
  // When the last gather was issued.
  Clock::time_point gather_issued() const { return gather_issued_; }

  // The gather into the parameters' storage, issued unless it is gathered or on its way.
  void gather_async();
  // Gathered: issues the gather if needed and waits for it.
  void wait_gathered();
  bool gathered() const { return full_state_ != FullState::kFreed; }
  // The storage given back (after the gather in flight, if any), the frozen part's too unless
  // `with_frozen` is false (Note [Frozen parameters: freed after the unit's backward]).
  void free(bool with_frozen = true);
  // Whether the unit holds frozen parameters (a frozen part, or nothing trainable).
  bool has_frozen() const { return frozen_ != nullptr || !trainable(); }

  // A backward may reach the unit: the gradients of the parameters `expected` marks (in params()
  // order; autograd accumulates them into .grad) are counted from here until reduce_async() or
  // keep_unreduced(), which take whatever came. Nothing for a unit without trainable parameters.
  void begin_backward(const std::vector<bool>& expected);
  bool in_backward() const { return in_backward_; }
  // In a backward, with every expected gradient in (at once where none is expected).
  bool gradients_in() const { return in_backward_ && grads_left_ == 0; }
  // A gradient of parameter `index` has been accumulated; true when it was the last expected.
  bool count_grad(size_t index);
  // The parameters' gradients added into one flat buffer laid out as the gathered parameters (to
  // what keep_unreduced() kept, if anything) and dropped, and its reduce-scatter (average) into
  // this rank's part issued (the buffer lives on until finish_reduce).
  void reduce_async();
  // Instead of reduce_async, in a backward without gradient sync (micro-batches before the last):
  // the gradients added into the flat buffer, which is kept whole for the next reduce_async.
  void keep_unreduced();
  bool reducing() const { return reduce_work_ != nullptr; }
  // Waits for the reduce-scatter and adds its result into the shard's .grad.
  void finish_reduce();

  // Whole tensors shaped as the parameters, gathered from every rank's `shard_like` (laid out as
  // the shard: the shard itself, or an optimizer's state of it) into new tensors (a collective).
  std::vector<torch::Tensor> gather_copies(const torch::Tensor& shard_like);
  // This rank's part of `values`, tensors shaped as the parameters (in params() order, shapes
  // checked by the caller): laid out as the shard, a new tensor.
  torch::Tensor part_of(const std::vector<torch::Tensor>& values) const;
  // The shard (and, while gathered, the parameters) set to this rank's part of `values`.
  void set_from(const std::vector<torch::Tensor>& values);
  // The most bytes one of the unit's buffers takes: the gathered parameters (param_dtype) or the
  // flat gradient (reduce_dtype); its frozen part's apart.
  int64_t buffer_bytes() const;
  // The bytes of its reduce-scatter's output (0 for a unit without trainable parameters).
  int64_t reduced_bytes() const;
  // Bytes held now: the shard and, while gathered, the whole buffer.
  int64_t resident_bytes() const;

 private:
  enum class FullState { kFreed, kGathering, kGathered };
  torch::Tensor flatten(const std::vector<torch::Tensor>& values) const;
  // The parameters' gradients added into kept_ (zeros at first) and dropped; ends the backward.
  torch::Tensor take_gradients();
  // Waits for this unit's own gather in flight, if any (not the frozen part's).
  void wait_own_gather();
  // Points the parameters at `full_` (gathered) or at tensors without storage (not).
  void show_parameters(bool gathered);
  // Each parameter's view of `full_` and its stand-in without storage (show_parameters' two).
  void make_views();

  std::string name_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  comm::ProcessGroup& group_;
  comm::ProcessGroup& reduce_group_;
  comm::ProcessGroup* replicate_;  // hybrid sharding's replicas (null: none)
  BufferPool& pool_;
  FlatLayout layout_;
  torch::Tensor shard_;   // [layout_.shard], a leaf the optimizer steps
  torch::Tensor full_;    // [layout_.padded] in param_dtype; its storage is empty while freed
  torch::Tensor memory_;  // what full_'s storage points at while gathered (a slot of the pool)
  torch::Tensor sent_;    // the shard cast to param_dtype while a gather reads it (mixed precision)
  std::vector<torch::Tensor> views_;    // of each parameter's place in full_
  std::vector<torch::Tensor> no_data_;  // each parameter's stand-in while not gathered
  c10::ScalarType reduce_dtype_;
  FullState full_state_ = FullState::kGathered;
  comm::WorkPtr gather_work_;
  torch::Tensor flat_grad_;  // [layout_.padded] while its reduce-scatter reads it
  torch::Tensor kept_;       // [layout_.padded] gradients of backwards without sync, not reduced
  bool in_backward_ = false;
  torch::Tensor reduced_;  // [layout_.shard] the reduce-scatter's output
  comm::WorkPtr reduce_work_;
  std::unique_ptr<Unit> frozen_;  // Note [Frozen parameters: a flat buffer of their own]
  mutable std::vector<torch::Tensor> pieces_;  // Note [Per-parameter views of the shard]
  mutable std::vector<int64_t> piece_begins_;  // where each piece starts in the shard
  std::vector<bool> grad_seen_;                // per parameter, in this backward
  size_t grads_left_ = 0;
  UnitTimes times_;
  Clock::time_point gather_issued_;
};

}  // namespace ddp::fsdp
