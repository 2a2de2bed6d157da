#pragma once
// TORCH_DISTRIBUTED_DEBUG=DETAIL, as PyTorch's ProcessGroupWrapper: before each collective the
// ranks compare what they are about to call (operation, reduction or root, dtype, shape, device
// type), over a group of their own, so that a rank that calls another collective, dtype or shape
// (or skips one) ends every rank at once with one message naming each differing rank and both
// calls, instead of hanging until the timeout or silently mixing unrelated tensors:
//
//   collective #5: rank 1 calls broadcast(float32[12]) from rank 0, ranks 0 and 2 call
//   all_reduce(sum, float32[10])
//
// The cost is one small all-gather per collective (docs/reliability.md has it measured); without
// DETAIL the group is not wrapped and nothing is added.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/launch_info.h"
#include "ddp/comm/process_group.h"

namespace ddp::comm {

// What one rank is about to call.
struct CallSignature {
  enum class Kind : int64_t {
    kAllReduce,
    kBroadcast,
    kAllGather,
    kReduceScatter,
    kAllToAll,
    kBarrier,
    kNewGroup
  };
  Kind kind = Kind::kBarrier;
  int64_t arg = 0;             // the reduction (ReduceOp), broadcast's root, new_group's rank count
  int64_t dtype = -1;          // c10::ScalarType of the (input) tensor; -1 without one
  int64_t device = -1;         // c10::DeviceType of it
  std::vector<int64_t> shape;  // its sizes
  uint64_t seq = 0;            // the collective's sequence number on its group

  bool operator==(const CallSignature& o) const {
    return kind == o.kind && arg == o.arg && dtype == o.dtype && device == o.device &&
           shape == o.shape && seq == o.seq;
  }
};

// A signature as the fixed number of int64 words the ranks all-gather (shapes of more than
// kSignatureDims dimensions keep their first ones and their element count), and back.
inline constexpr int64_t kSignatureDims = 8;
inline constexpr int64_t kSignatureWords = 7 + kSignatureDims;
std::vector<int64_t> encode(const CallSignature& call);
CallSignature decode(const int64_t* words);

// "all_reduce(sum, float32[10])", "broadcast(float32[12]) from rank 0", "barrier()".
std::string describe(const CallSignature& call);

// "" where every rank's call is the same; else "collective #5: rank 1 calls ..., ranks 0 and 2
// call ...": the ranks grouped by their call, the smaller groups first. A pure function.
std::string mismatch_message(const std::vector<CallSignature>& by_rank);

// `inner` with DETAIL's check before each of its collectives (its subgroups too). A collective
// of `inner`: every rank calls it, as new_group (the comparisons travel on a group of their own).
std::shared_ptr<ProcessGroup> check_collectives(std::shared_ptr<ProcessGroup> inner);

// TORCH_DISTRIBUTED_DEBUG, as PyTorch reads it: unset or OFF, INFO, DETAIL (any case). InputError
// naming the variable and its value otherwise.
enum class DebugLevel { kOff, kInfo, kDetail };
DebugLevel debug_level(const Env& env);

}  // namespace ddp::comm
