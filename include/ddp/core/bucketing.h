#pragma once
// Bucket assignment: which gradients are all-reduced together. A pure function, equal to c10d's
// compute_bucket_assignment_by_size (tested against it), so our buckets are PyTorch's.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp::core {

constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;  // 1 MiB, as DDP's
constexpr size_t kDefaultBucketCapBytes = size_t{25} << 20;   // 25 MiB, as DDP's bucket_cap_mb

// Bytes of a size in MiB (DDP's bucket_cap_mb), truncated as PyTorch's int(bucket_cap_mb * MiB).
inline size_t mib_to_bytes(double mb) {
  return static_cast<size_t>(mb * 1024 * 1024);
}

// The size in MiB of `bytes`: mib_to_bytes' inverse, for a size kept in bytes.
inline double bytes_to_mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024 * 1024);
}

// What bucketing needs to know of a gradient.
struct TensorSlot {
  size_t bytes = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
};

struct BucketAssignment {
  std::vector<std::vector<size_t>> buckets;  // indices into the tensor list
  std::vector<size_t> size_limits;           // the limit each bucket was filled against
};

// Visits the tensors in `order` (all indices; empty: 0, 1, ..., n-1) and fills one open bucket per
// (dtype, device). A bucket closes once its bytes reach the current limit; each (dtype, device)
// walks through `size_limits` one bucket at a time and then stays on the last limit. Open buckets
// close at the end, in the order their (dtype, device) first appeared. With an empty `order` the
// buckets are then sorted by their smallest index (c10d's rule); with an `order` they stay in
// visiting order (the gradient-ready order when rebuilding).
BucketAssignment assign_buckets(const std::vector<TensorSlot>& tensors,
                                const std::vector<size_t>& size_limits,
                                const std::vector<int64_t>& order = {});

// The slots of these tensors.
std::vector<TensorSlot> slots_of(const std::vector<at::Tensor>& tensors);

// n-1, ..., 1, 0: the order DDP starts from, since gradients arrive roughly in reverse
// registration order.
std::vector<int64_t> reverse_order(size_t n);

}  // namespace ddp::core
