#include "ddp/comm/diagnostics/collective_check.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>
#include <utility>

namespace ddp::comm {
namespace {

using Kind = CallSignature::Kind;

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kNewGroup:
      return "new_group";
  }
  return "?";
}

// "float32[12, 3]", with " on cuda" off the CPU.
std::string tensor_text(const CallSignature& call) {
  std::string dims;
  for (size_t i = 0; i < call.shape.size(); ++i) {
    dims += fmt::format("{}{}", i == 0 ? "" : ", ", call.shape[i]);
  }
  std::string text =
      fmt::format("{}[{}]", dtype_name(static_cast<c10::ScalarType>(call.dtype)), dims);
  if (call.device != static_cast<int64_t>(c10::DeviceType::CPU)) {
    text += " on " + c10::DeviceTypeName(static_cast<c10::DeviceType>(call.device), true);
  }
  return text;
}

// "rank 1", "ranks 0 and 2", "ranks 0, 2 and 3".
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  std::string text = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const char* separator = i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ";
    text += fmt::format("{}{}", separator, ranks[i]);
  }
  return text;
}

CallSignature signature(Kind kind, int64_t arg, const at::Tensor* tensor, uint64_t seq) {
  CallSignature call;
  call.kind = kind;
  call.arg = arg;
  call.seq = seq;
  if (tensor != nullptr) {
    call.dtype = static_cast<int64_t>(tensor->scalar_type());
    call.device = static_cast<int64_t>(tensor->device().type());
    call.shape = tensor->sizes().vec();
  }
  return call;
}

// A process group that checks each collective against the other ranks' before handing it to
// `inner`. The comparisons travel on `checker_`, a group of the same ranks made for them alone
// (inner's own collectives would mismatch in turn).
class CheckedGroup : public ProcessGroup {
 public:
  explicit CheckedGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->world_size(), inner->options()),
        inner_(std::move(inner)) {
    // Numbered from where `inner` stands before the checker's new_group, so that the caller's
    // first collective is #1 here as without DETAIL (inner's own messages count one more).
    wrap(*inner_);
    std::vector<int> all(static_cast<size_t>(world_size()));
    std::iota(all.begin(), all.end(), 0);
    checker_ = inner_->new_group(all);
    // NCCL takes CUDA tensors only: the signatures travel on this rank's current GPU there.
    device_ = inner_->backend_name() == "nccl" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  }
  std::string backend_name() const override { return inner_->backend_name(); }
  void set_phase(std::string phase) override {
    inner_->set_phase(phase);
    ProcessGroup::set_phase(std::move(phase));
  }

 protected:
  WorkPtr do_all_reduce(at::Tensor& t, ReduceOp op, const CollectiveInfo& info) override {
    check(signature(Kind::kAllReduce, static_cast<int64_t>(op), &t, info.seq), info);
    return inner_->all_reduce(t, op);
  }
  WorkPtr do_broadcast(at::Tensor& t, int root, const CollectiveInfo& info) override {
    check(signature(Kind::kBroadcast, root, &t, info.seq), info);
    return inner_->broadcast(t, root);
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in,
                        const CollectiveInfo& info) override {
    check(signature(Kind::kAllGather, 0, &in, info.seq), info);
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                            const CollectiveInfo& info) override {
    check(signature(Kind::kReduceScatter, static_cast<int64_t>(op), &in, info.seq), info);
    return inner_->reduce_scatter(out, in, op);
  }
  WorkPtr do_all_to_all(at::Tensor& out, const at::Tensor& in,
                        const CollectiveInfo& info) override {
    check(signature(Kind::kAllToAll, 0, &in, info.seq), info);
    return inner_->all_to_all(out, in);
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    check(signature(Kind::kBarrier, 0, nullptr, info.seq), info);
    return inner_->barrier();
  }
  at::Tensor do_allocate_buffer(int64_t numel, const at::TensorOptions& options) override {
    return inner_->allocate_buffer(numel, options);  // inner's buffers, for inner's collectives
  }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& info) override {
    check(signature(Kind::kNewGroup, static_cast<int64_t>(ranks.size()), nullptr, info.seq), info);
    auto sub = inner_->new_group(ranks);
    return sub ? check_collectives(std::move(sub)) : nullptr;
  }

 private:
  // Every rank's signature of this collective; throws InputError, on every rank alike, when they
  // differ. A rank that never comes leaves the others waiting here until the group's timeout.
  void check(const CallSignature& mine, const CollectiveInfo& info) {
    const auto words = encode(mine);
    auto local = at::tensor(words, at::kLong).to(device_);
    auto all = at::empty({world_size() * kSignatureWords}, local.options());
    try {
      checker_->all_gather(all, local)->wait();
    } catch (const CommError& e) {
      throw CommError(info,
                      fmt::format("rank {}: while comparing {} #{} ({}) with the other ranks' "
                                  "call (TORCH_DISTRIBUTED_DEBUG=DETAIL): {}",
                                  rank(), info.op, info.seq, describe(mine), e.what()));
    }
    all = all.cpu();
    std::vector<CallSignature> by_rank;
    for (int r = 0; r < world_size(); ++r) {
      by_rank.push_back(decode(all.data_ptr<int64_t>() + r * kSignatureWords));
    }
    const std::string mismatch = mismatch_message(by_rank);
    if (!mismatch.empty()) throw InputError(mismatch + " (TORCH_DISTRIBUTED_DEBUG=DETAIL)");
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<ProcessGroup> checker_;
  at::Device device_{at::kCPU};
};

}  // namespace

std::vector<int64_t> encode(const CallSignature& call) {
  std::vector<int64_t> words(kSignatureWords, 0);
  const int64_t ndim = static_cast<int64_t>(call.shape.size());
  int64_t numel = 1;
  for (const int64_t d : call.shape) numel *= d;
  words[0] = static_cast<int64_t>(call.kind);
  words[1] = call.arg;
  words[2] = call.dtype;
  words[3] = call.device;
  words[4] = static_cast<int64_t>(call.seq);
  words[5] = ndim;
  words[6] = numel;
  for (int64_t i = 0; i < std::min(ndim, kSignatureDims); ++i) words[7 + i] = call.shape[i];
  return words;
}

CallSignature decode(const int64_t* words) {
  CallSignature call;
  call.kind = static_cast<Kind>(words[0]);
  call.arg = words[1];
  call.dtype = words[2];
  call.device = words[3];
  call.seq = static_cast<uint64_t>(words[4]);
  const int64_t ndim = words[5];
  if (ndim > kSignatureDims) {
    // Beyond what travels: the first dimensions and, last, the element count, so that two shapes
    // of many dimensions that differ still differ here.
    call.shape.assign(words + 7, words + 7 + kSignatureDims);
    call.shape.push_back(words[6]);
  } else {
    call.shape.assign(words + 7, words + 7 + std::max<int64_t>(ndim, 0));
  }
  return call;
}

std::string describe(const CallSignature& call) {
  const char* name = kind_name(call.kind);
  switch (call.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceScatter:
      return fmt::format("{}({}, {})", name, to_string(static_cast<ReduceOp>(call.arg)),
                         tensor_text(call));
    case Kind::kBroadcast:
      return fmt::format("{}({}) from rank {}", name, tensor_text(call), call.arg);
    case Kind::kAllGather:
    case Kind::kAllToAll:
      return fmt::format("{}({})", name, tensor_text(call));
    case Kind::kBarrier:
      return "barrier()";
    case Kind::kNewGroup:
      return fmt::format("new_group({} ranks)", call.arg);
  }
  return name;
}

std::string mismatch_message(const std::vector<CallSignature>& by_rank) {
  // The ranks of each distinct call, in the order of their lowest rank.
  std::vector<std::pair<CallSignature, std::vector<int>>> calls;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    auto same = std::find_if(calls.begin(), calls.end(),
                             [&](const auto& c) { return c.first == by_rank[r]; });
    if (same == calls.end()) {
      calls.push_back({by_rank[r], {r}});
    } else {
      same->second.push_back(r);
    }
  }
  if (calls.size() <= 1) return "";
  std::stable_sort(calls.begin(), calls.end(),
                   [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  std::string text = fmt::format("collective #{}: ", by_rank.front().seq);
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& [call, ranks] = calls[i];
    text += fmt::format("{}{} call{} {}", i == 0 ? "" : ", ", ranks_text(ranks),
                        ranks.size() == 1 ? "s" : "", describe(call));
  }
  return text;
}

std::shared_ptr<ProcessGroup> check_collectives(std::shared_ptr<ProcessGroup> inner) {
  return std::make_shared<CheckedGroup>(std::move(inner));
}

DebugLevel debug_level(const Env& env) {
  const auto found = env.find("TORCH_DISTRIBUTED_DEBUG");
  if (found == env.end()) return DebugLevel::kOff;
  std::string value = found->second;
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (value == "OFF") return DebugLevel::kOff;
  if (value == "INFO") return DebugLevel::kInfo;
  if (value == "DETAIL") return DebugLevel::kDetail;
  throw InputError(
      fmt::format("environment variable TORCH_DISTRIBUTED_DEBUG={}: expected OFF, INFO or DETAIL",
                  found->second));
}

}  // namespace ddp::comm
