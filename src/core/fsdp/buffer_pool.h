#pragma once
// The memory a sharded model's units gather into and reduce from, kept from step to step. A
// private header of src/core/fsdp.
//
// Note [Buffers kept from step to step]
// Each step gathers every unit twice (forward and backward) and reduce-scatters each once, from
// buffers the size of a unit. Allocated anew each time, a buffer that large is mapped and unmapped
// by the C library (glibc serves blocks over 32 MiB with mmap at any threshold), and every page
// of it faults in again: on the CPU that was twice DDP's minor faults per step, and a good part
// of its system time. So the units gather into, and reduce from, slots made once, as large as the
// largest unit's buffer, as many as units are gathered at a time: two with prefetch (in the
// forward the unit that computes and the next; in the backward the unit that computes and the one
// before it), one without, and one more for a large root unit, gathered from the start of the
// forward to the end of the backward. A unit whose backward ends gives its gathered slot back and
// takes one for its flat gradient; that reduce-scatter is waited for when the next unit's
// backward begins, before the gather that unit prefetches takes a slot. One more slot, as large as
// the largest shard, takes the reduce-scatter's output. A buffer under half of the smallest slot
// that would hold it is allocated as before: it would keep a slot from a large one, and small
// blocks come from the C library's heap without faulting pages in each time.
// What finds no free slot (units kept gathered after their forward, gradients kept between
// backwards without sync, a unit's frozen part beside its trainable one) is allocated as before.
// The slots come from ProcessGroup::allocate_buffer (the shm backend's segment, where its
// collectives can later read them in place), a collective made once, at construction, in the same
// place on every rank; the pool never grows, since growing while the step runs would be a
// collective at a point the ranks need not share.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::fsdp {

class BufferPool {
 public:
  BufferPool();
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Makes `count` slots of `bytes` each on `device` through group.allocate_buffer (a collective:
  // every rank calls it with the same arguments at the same point).
  void reserve(comm::ProcessGroup& group, c10::Device device, int64_t bytes, int count);
  // A tensor of `numel` elements of `options`: in the smallest free slot of its device that holds
  // it, when it takes at least half of that slot; otherwise newly allocated memory. The slot is
  // free again once every reference to the tensor is gone (a collective that still reads it holds
  // one). Its values are whatever the slot held last.
  torch::Tensor take(int64_t numel, const torch::TensorOptions& options);

 private:
  struct Slots;
  std::shared_ptr<Slots> slots_;  // shared with the tensors taken, which give their slot back
};

}  // namespace ddp::fsdp
