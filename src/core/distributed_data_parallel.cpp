#include "ddp/core/distributed_data_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"

namespace ddp {
namespace {

std::string describe(const std::string& name, const torch::Tensor& t) {
  return fmt::format("'{}' [{}] {}", name, fmt::join(t.sizes().begin(), t.sizes().end(), ", "),
                     comm::dtype_name(t.scalar_type()));
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

torch::Device device_of(const std::vector<torch::Tensor>& tensors) {
  return tensors.empty() ? torch::Device(torch::kCPU) : tensors.front().device();
}

}  // namespace

void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                         int root) {
  if (tensors.empty() || group.world_size() == 1) return;
  const auto groups = core::assign_buckets(core::slots_of(tensors), {core::kDefaultBucketCapBytes});
  for (const auto& indices : groups.buckets) {
    std::vector<torch::Tensor> flat_parts;
    for (size_t i : indices) flat_parts.push_back(tensors[i].detach().reshape({-1}));
    auto flat = torch::cat(flat_parts);
    group.broadcast(flat, root)->wait();
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (size_t i : indices) {
      const auto n = tensors[i].numel();
      tensors[i].variable_data().copy_(flat.narrow(0, offset, n).view_as(tensors[i]));
      offset += n;
    }
  }
}

void verify_same_across_ranks(comm::ProcessGroup& group, const std::vector<std::string>& names,
                              const std::vector<torch::Tensor>& tensors) {
  std::string description;
  for (size_t i = 0; i < tensors.size(); ++i) description += describe(names[i], tensors[i]) + "\n";
  const auto device = device_of(tensors);
  // A fingerprint per rank: count and hash. All ranks see all fingerprints, so all ranks agree
  // on whether to go on, and issue the same collectives below.
  constexpr size_t kFingerprintBytes = 48;  // two decimal 64-bit numbers and a space
  const std::string mine =
      fmt::format("{} {}", tensors.size(), std::hash<std::string>{}(description));
  const auto all = comm::all_gather_bytes(group, mine, device, kFingerprintBytes);
  std::vector<int> differing;
  for (int r = 1; r < group.world_size(); ++r) {
    if (all[static_cast<size_t>(r)] != all[0]) differing.push_back(r);
  }
  if (differing.empty()) return;

  const auto reference = split_lines(comm::broadcast_bytes(group, description, 0, device));
  const auto here = split_lines(description);
  std::string first_difference;
  for (size_t i = 0; i < std::max(reference.size(), here.size()); ++i) {
    const std::string theirs = i < reference.size() ? reference[i] : "nothing";
    const std::string ours = i < here.size() ? here[i] : "nothing";
    if (theirs != ours) {
      first_difference = fmt::format("parameter {} is {} here but {} on rank 0", i, ours, theirs);
      break;
    }
  }
  if (first_difference.empty()) {
    throw InputError(
        fmt::format("rank {}: the model differs across ranks: rank(s) {} hold other "
                    "parameters than rank 0 (they name the first difference)",
                    group.rank(), fmt::join(differing, ", ")));
  }
  throw InputError(
      fmt::format("rank {}: the model differs from rank 0's ({} parameters here, {} "
                  "there): {}",
                  group.rank(), here.size(), reference.size(), first_difference));
}

DistributedDataParallelBase::DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module,
                                                         std::shared_ptr<comm::ProcessGroup> group,
                                                         DistributedDataParallelOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  register_module("module", module_);
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<torch::Tensor> state;  // parameters and buffers, for the initial broadcast
  std::vector<std::string> state_names;
  for (const auto& item : module_->named_parameters()) {
    state.push_back(item.value());
    state_names.push_back(item.key());
    if (item.value().requires_grad()) {
      params.push_back(item.value());
      names.push_back(item.key());
    }
  }
  for (const auto& item : module_->named_buffers()) {
    state.push_back(item.value());
    state_names.push_back(item.key());
  }
  if (options_.init_sync()) {
    verify_same_across_ranks(*group_, state_names, state);
    broadcast_coalesced(*group_, state);
  }
  core::ReducerOptions reducer_options;
  reducer_options.bucket_cap_bytes = core::mib_to_bytes(options_.bucket_cap_mb());
  reducer_options.first_bucket_bytes = core::mib_to_bytes(options_.first_bucket_mb());
  reducer_options.find_unused_parameters = options_.find_unused_parameters();
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  reducer_options.static_graph = options_.static_graph();
  if (!params.empty()) {
    reducer_ = std::make_unique<core::Reducer>(params, names, group_, reducer_options);
  }
}

bool DistributedDataParallelBase::buffers_due() {
  if (!options_.broadcast_buffers() || module_->buffers().empty()) return false;
  if (torch::GradMode::is_enabled() && reducer_) {
    // Every rank makes the same decision: ranks run the same forwards and backwards.
    const int64_t backwards = reducer_->backward_count();
    if (backwards == buffers_broadcast_at_) return false;  // a later forward of the iteration
    buffers_broadcast_at_ = backwards;
  }
  return true;
}

void DistributedDataParallelBase::pre_forward() {
  const bool broadcast = buffers_due();
  const int root = joining_ ? join_notify(broadcast) : 0;
  if (broadcast) {
    group_->set_phase("forward: buffers");  // for the flight recorder
    broadcast_coalesced(*group_, module_->buffers(), root);
  }
}

// Join's notice: [one per rank: 1 if it trains, then whether the backward reduces, whether this
// forward broadcasts the buffers], summed; a joined rank adds zeros (finish_join).
namespace {
constexpr int64_t kSyncFlag = 0, kBuffersFlag = 1;

torch::Tensor join_notice(comm::ProcessGroup& group, torch::Device device, int64_t mine, bool sync,
                          bool buffers) {
  const int64_t world = group.world_size();
  auto notice = torch::zeros({world + 2}, torch::TensorOptions(torch::kInt).device(device));
  if (mine >= 0) {
    notice[mine] = 1;
    notice[world + kSyncFlag] = sync ? 1 : 0;
    notice[world + kBuffersFlag] = buffers ? 1 : 0;
  }
  group.set_phase("join: notice");
  group.all_reduce(notice, comm::ReduceOp::kSum)->wait();
  return notice.cpu();
}

int lowest_training_rank(const torch::Tensor& notice, int world) {
  for (int r = 0; r < world; ++r) {
    if (notice[r].item<int>() > 0) return r;
  }
  return -1;
}
}  // namespace

int DistributedDataParallelBase::join_notify(bool broadcasts_buffers) {
  const auto notice = join_notice(*group_, device_of(module_->parameters()), group_->rank(),
                                  reducer_ && reducer_->require_sync(), broadcasts_buffers);
  return lowest_training_rank(notice, group_->world_size());
}

void DistributedDataParallelBase::begin_join() {
  if (options_.static_graph()) {
    throw InputError("Join (uneven inputs) does not support static_graph");
  }
  joining_ = true;
}

void DistributedDataParallelBase::finish_join() {
  if (!joining_) throw Error("finish_join() without begin_join()");
  joining_ = false;
  const int world = group_->world_size();
  bool last_joiner = true;
  while (true) {  // one round per iteration of the ranks still training
    const auto notice = join_notice(*group_, device_of(module_->parameters()), -1, false, false);
    const int root = lowest_training_rank(notice, world);
    if (root < 0) break;  // every rank has joined
    last_joiner = false;
    if (notice[world + kBuffersFlag].item<int>() > 0) {
      broadcast_coalesced(*group_, module_->buffers(), root);
    }
    if (notice[world + kSyncFlag].item<int>() > 0 && reducer_) reducer_->join_backward();
  }
  // The ranks that trained last hold the final model (PyTorch: the highest of them).
  const int authority = static_cast<int>(
      comm::all_reduce_scalar(*group_, last_joiner ? group_->rank() : -1, comm::ReduceOp::kMax,
                              device_of(module_->parameters())));
  auto state = module_->parameters();
  for (const auto& b : module_->buffers()) state.push_back(b);
  broadcast_coalesced(*group_, state, authority);
}

void DistributedDataParallelBase::set_bucket_cap_mb(double mb) {
  options_.bucket_cap_mb(mb);
  if (reducer_) reducer_->set_bucket_cap(core::mib_to_bytes(mb));
}

void DistributedDataParallelBase::zero_grad(bool set_to_none) {
  for (auto& p : module_->parameters()) {
    auto& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad = torch::Tensor();
    } else {
      grad.zero_();  // in place: a bucket view stays a view
    }
  }
}

DistributedDataParallelBase::NoSyncGuard::NoSyncGuard(core::Reducer& reducer)
    : reducer_(reducer), previous_(reducer.require_sync()) {
  reducer_.set_require_sync(false);
}

DistributedDataParallelBase::NoSyncGuard::~NoSyncGuard() {
  reducer_.set_require_sync(previous_);
}

}  // namespace ddp
