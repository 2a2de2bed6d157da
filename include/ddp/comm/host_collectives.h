#pragma once
// Host values across ranks: strings, byte records, scalars and flags, moved through a process
// group's tensor collectives. Each function is a collective: every rank calls it, in the same
// order (Note [Collective order is identical on all ranks]), with the same arguments except its
// own value. `device` is where the group's tensors live: the CPU for gloo, mpi and local, the
// rank's GPU for nccl. The values are copied to it and back; the call returns when done.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::comm {

// Every rank's bytes on every rank, indexed by rank.
// With `max_bytes` > 0 every rank's bytes must fit in it (else Error): one all_gather of records
// of that fixed size. With 0 the sizes are free: two all_gathers, the lengths, then the bytes
// padded to the longest.
std::vector<std::string> all_gather_bytes(ProcessGroup& group, const std::string& mine,
                                          const c10::Device& device, size_t max_bytes = 0);

// `root`'s bytes on every rank (two broadcasts: the length, then the bytes). Other ranks' `mine`
// is ignored.
std::string broadcast_bytes(ProcessGroup& group, const std::string& mine, int root,
                            const c10::Device& device);

// The reduction of every rank's `value` (one all_reduce of a float64; integers up to 2^53 are
// exact). kAvg divides the sum by the world size.
double all_reduce_scalar(ProcessGroup& group, double value, ReduceOp op, const c10::Device& device);

// Whether `mine` is true on any rank (one all_reduce).
bool any_rank(ProcessGroup& group, bool mine, const c10::Device& device);

// Every rank's `row` (1-d, of the same length and dtype on every rank) as one host tensor
// [world size, length], row r being rank r's (one all_gather). With ranks_differing(), the way
// ranks compare what they hold (parameters' checksums, a state's digest, a count):
//
//   const at::Tensor rows = all_gather_rows(group, torch::tensor({digest}), device);
//   for (int64_t r : ranks_differing(rows, source)) ...   // the ranks that hold another state
at::Tensor all_gather_rows(ProcessGroup& group, const at::Tensor& row, const c10::Device& device);

// The ranks whose row of `rows` (as all_gather_rows gives them) differs from row `reference` in
// any element, ascending. A pure function.
std::vector<int64_t> ranks_differing(const at::Tensor& rows, int64_t reference);

}  // namespace ddp::comm
