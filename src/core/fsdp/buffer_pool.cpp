#include "buffer_pool.h"

#include <torch/torch.h>

#include <optional>

#include "ddp/common/error.h"

namespace ddp::fsdp {

struct BufferPool::Slots {
  struct Slot {
    torch::Tensor memory;  // allocate_buffer's tensor: owns the bytes
    bool free = true;
  };
  std::mutex mutex;  // a taken tensor may be dropped on a backend's thread
  std::vector<Slot> slots;
};

BufferPool::BufferPool() : slots_(std::make_shared<Slots>()) {}

BufferPool::~BufferPool() = default;

void BufferPool::reserve(comm::ProcessGroup& group, c10::Device device, int64_t bytes, int count) {
  DDP_CHECK(bytes > 0 && count >= 0, "slots of a positive size");
  for (int i = 0; i < count; ++i) {
    auto memory = group.allocate_buffer(bytes, torch::TensorOptions(torch::kUInt8).device(device));
    std::lock_guard<std::mutex> lock(slots_->mutex);
    slots_->slots.push_back({std::move(memory)});
  }
}

torch::Tensor BufferPool::take(int64_t numel, const torch::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  std::lock_guard<std::mutex> lock(slots_->mutex);
  // The smallest free slot that holds it, if it takes at least half of that slot: a small buffer
  // in a large slot would leave a large one without.
  std::optional<size_t> best;
  for (size_t i = 0; i < slots_->slots.size(); ++i) {
    const auto& slot = slots_->slots[i];
    const int64_t size = slot.memory.numel();
    if (!slot.free || slot.memory.device() != options.device() || size < bytes ||
        size > 2 * bytes || (best && size >= slots_->slots[*best].memory.numel())) {
      continue;
    }
    best = i;
  }
  if (!best) return torch::empty({numel}, options);
  slots_->slots[*best].free = false;
  // The deleter holds the slots (not the pool), so a tensor that outlives the pool keeps its
  // memory; it frees the slot when the tensor's last reference goes.
  return torch::from_blob(
      slots_->slots[*best].memory.data_ptr(), {numel},
      [slots = slots_, i = *best](void*) {
        std::lock_guard<std::mutex> lock(slots->mutex);
        slots->slots[i].free = true;
      },
      options);
}

}  // namespace ddp::fsdp
