#include "ddp/comm/process_group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace ddp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

void sum_to_average(at::Tensor& sum, int world_size) {
  if (at::isIntegralType(sum.scalar_type(), /*includeBool=*/false)) {
    sum.div_(world_size, "trunc");
  } else {
    sum.div_(world_size);
  }
}

std::string failure_message(const CollectiveInfo& info, const std::string& backend,
                            const std::string& why) {
  return fmt::format("rank {}: {} #{} failed on backend {}: {}", info.rank, info.op, info.seq,
                     backend, why.substr(0, why.find('\n')));
}

CommError::CommError(CollectiveInfo info, const std::string& what)
    : Error(what, kExitFailure), info_(std::move(info)) {}

ProcessGroup::ProcessGroup(int rank, int world_size, ProcessGroupOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {}

CollectiveInfo ProcessGroup::next_info(std::string op, const at::Tensor* tensor) {
  CollectiveInfo info;
  info.op = std::move(op);
  info.seq = ++seq_;
  info.rank = rank_;
  info.world_size = world_size_;
  if (tensor != nullptr) {
    info.numel = tensor->numel();
    info.dtype = dtype_name(tensor->scalar_type());
  }
  return info;
}

std::string ProcessGroup::timeout_message(const CollectiveInfo& info) const {
  return fmt::format(
      "rank {}: {} #{} ({} elements of {}) timed out after {} s on backend {}: expected ranks "
      "0-{} to join it; a rank that crashed, hangs, or issued its collectives in another order "
      "(see Note [Collective order is identical on all ranks]) has not",
      info.rank, info.op, info.seq, info.numel, info.dtype.empty() ? "-" : info.dtype,
      std::chrono::duration<double>(options_.timeout).count(), backend_name(), info.world_size - 1);
}

WorkPtr ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  DDP_CHECK(tensor.is_contiguous(), "all_reduce needs a contiguous tensor");
  const auto info = next_info(fmt::format("all_reduce({})", to_string(op)), &tensor);
  return do_all_reduce(tensor, op, info);
}

WorkPtr ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  DDP_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  DDP_CHECK(root >= 0 && root < world_size_, "broadcast root outside the group");
  const auto info = next_info(fmt::format("broadcast(root {})", root), &tensor);
  return do_broadcast(tensor, root, info);
}

WorkPtr ProcessGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  DDP_CHECK(output.is_contiguous() && input.is_contiguous(), "all_gather needs contiguous tensors");
  DDP_CHECK(
      output.numel() == input.numel() * world_size_ && output.scalar_type() == input.scalar_type(),
      "all_gather output must be world_size * input.numel() of input's dtype");
  const auto info = next_info("all_gather", &input);
  return do_all_gather(output, input, info);
}

WorkPtr ProcessGroup::barrier() {
  const auto info = next_info("barrier", nullptr);
  return do_barrier(info);
}

}  // namespace ddp::comm
