#pragma once
// The order every rank issues a sharded model's gathers and reduce-scatters in, whatever its own
// forward calls and its own backward reaches. A private header of src/core/fsdp.
//
// Note [Units unused on some ranks]
// A collective completes once every rank has issued it, and the ranks' collectives are matched by
// their places in the group's sequence (Note [Collective order is identical on all ranks] in
// ddp/comm/process_group.h). A unit that one rank's forward does not call (a branch its data
// takes, an expert no token of its batch chose), or that its loss does not reach, would leave that
// rank's sequence short of the others'; DDP's find_unused_parameters answers the same. So no
// rank's collectives follow its own calls:
// - Forward: every unit is gathered once per forward, in one order (InOrder). Calling a unit issues
//   the gathers due up to it (units passed over are kept until called, or freed at the end of the
//   forward), and the end of the forward issues those not yet due, freed once they complete.
// - The end of a forward with gradients: one small all-reduce (max) agrees on two things. The
//   order of the ranks' calls (each unit at its earliest place on any rank) becomes the next
//   forward's order (next_gather_order in fully_shard.h), so a model that calls its units in
//   another order than it lists them (the Informer's attention and convolution layers) gathers
//   ahead only in its first step, and the backward's order follows the ranks' graphs. And which
//   units some rank called with gradients: only those take part in the backward.
// - Backward: those units' gathers (reshard_after_forward) go in the reverse of that order, on the
//   model's group; their reduce-scatters in the same order, the root last, on a group of their
//   own (ProcessGroup::new_group of the same ranks), since how a rank's gathers and
//   reduce-scatters interleave follows its own graph. A unit whose backward does not run on this
//   rank is gathered only to take part, and freed; its reduce-scatter sends zeros, as soon as the
//   units before it in the order have sent theirs. A unit whose gradients are all in before
//   those of a unit ahead of it waits (its gradients held) until that one has been sent.
// A rank knows which of its units its backward reaches: those its forward called with an output
// that requires grad, or, where FullyShardedDataParallel::backward(loss) is given the loss, those
// whose parameters the loss's graph reaches. A unit called but left out of the loss on some ranks
// needs backward(loss); with a plain loss.backward() the other ranks wait for its gradients until
// the group's timeout.

#include <cstddef>
#include <utility>
#include <vector>

namespace ddp::fsdp {

class Unit;

// Units whose collectives of one kind (the forward's gathers, the backward's, the
// reduce-scatters) are issued one after another in an order every rank shares.
class InOrder {
 public:
  InOrder() = default;
  explicit InOrder(std::vector<Unit*> units) : units_(std::move(units)) {}

  // Those not yet issued from the next one through `unit` and `ahead` more after it (none for a
  // unit not in the order), which count as issued from now on.
  std::vector<Unit*> through(const Unit* unit, size_t ahead = 0);
  // Every one not yet issued, which now count as issued.
  std::vector<Unit*> rest();
  // The next one to issue (nullptr: none left), and a step past it.
  Unit* next() const { return next_ < units_.size() ? units_[next_] : nullptr; }
  void pop() { ++next_; }
  const std::vector<Unit*>& units() const { return units_; }

 private:
  std::vector<Unit*> take_until(size_t end);

  std::vector<Unit*> units_;
  size_t next_ = 0;
};

}  // namespace ddp::fsdp
