#include "ddp/core/bucketing.h"

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::core {
namespace {

struct OpenBucket {
  c10::ScalarType dtype;
  c10::Device device;
  std::vector<size_t> indices;
  size_t bytes = 0;
  size_t limit_index = 0;  // into size_limits
};

}  // namespace

BucketAssignment assign_buckets(const std::vector<TensorSlot>& tensors,
                                const std::vector<size_t>& size_limits,
                                const std::vector<int64_t>& order) {
  DDP_CHECK(!size_limits.empty(), "assign_buckets needs at least one size limit");
  DDP_CHECK(order.empty() || order.size() == tensors.size(), "order must name every tensor once");
  BucketAssignment out;
  std::vector<OpenBucket> open;  // one per (dtype, device), in order of first appearance
  auto close = [&](OpenBucket& b) {
    out.buckets.push_back(std::move(b.indices));
    out.size_limits.push_back(size_limits[b.limit_index]);
    b.indices.clear();
    b.bytes = 0;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t index = order.empty() ? i : static_cast<size_t>(order[i]);
    DDP_CHECK(index < tensors.size(), "order names a tensor that does not exist");
    const TensorSlot& t = tensors[index];
    auto it = std::find_if(open.begin(), open.end(), [&](const OpenBucket& b) {
      return b.dtype == t.dtype && b.device == t.device;
    });
    if (it == open.end()) it = open.insert(open.end(), OpenBucket{t.dtype, t.device, {}, 0, 0});
    it->indices.push_back(index);
    it->bytes += t.bytes;
    if (it->bytes >= size_limits[it->limit_index]) {
      close(*it);
      it->limit_index = std::min(it->limit_index + 1, size_limits.size() - 1);
    }
  }
  for (auto& b : open) {
    if (!b.indices.empty()) close(b);
  }
  if (order.empty()) {
    // Sort buckets (with their limits) by smallest index, so they become ready in sequence.
    std::vector<size_t> perm(out.buckets.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    auto min_of = [&](size_t b) {
      return *std::min_element(out.buckets[b].begin(), out.buckets[b].end());
    };
    std::stable_sort(perm.begin(), perm.end(),
                     [&](size_t a, size_t b) { return min_of(a) < min_of(b); });
    BucketAssignment sorted;
    for (size_t b : perm) {
      sorted.buckets.push_back(out.buckets[b]);
      sorted.size_limits.push_back(out.size_limits[b]);
    }
    return sorted;
  }
  return out;
}

std::vector<TensorSlot> slots_of(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorSlot> slots;
  for (const auto& t : tensors) {
    slots.push_back(
        {static_cast<size_t>(t.numel()) * t.element_size(), t.scalar_type(), t.device()});
  }
  return slots;
}

std::vector<int64_t> reverse_order(size_t n) {
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(n - 1 - i);
  return out;
}

}  // namespace ddp::core
