#include "optimizer_state.h"

#include <fmt/format.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <utility>

#include "ddp/common/error.h"
#include "torch_compat.h"
#include "torch_errors.h"

namespace ddp::train {
namespace {

// Adam's or AdamW's state (the same fields), when `s` is one of type `State`.
template <class State>
bool add_adam_state(Digest& d, const torch::optim::OptimizerParamState* s) {
  const auto* adam = dynamic_cast<const State*>(s);
  if (adam == nullptr) return false;
  d.add_value(adam->step());
  d.add(adam->exp_avg());
  d.add(adam->exp_avg_sq());
  d.add(adam->max_exp_avg_sq());
  return true;
}

}  // namespace

std::string serialized(const torch::optim::Optimizer& optimizer) {
  std::string out;  // appended to directly: an ostringstream's str() would copy it whole
  torch::save(optimizer, [&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  return out;
}

at::Tensor byte_tensor(const std::string& bytes) {
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())},
                          torch::kByte)
      .clone();
}

at::Tensor byte_tensor(std::string&& bytes) {
  auto owned = std::make_shared<std::string>(std::move(bytes));
  return torch::from_blob(
      owned->data(), {static_cast<int64_t>(owned->size())}, [owned](void*) {}, torch::kByte);
}

void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& state,
                    const std::string& path, const c10::Device& device) {
  try {
    const at::Tensor bytes = state.contiguous();  // read where it lies (a mapped file): no copy
    torch::load(optimizer, static_cast<const char*>(bytes.data_ptr()),
                static_cast<size_t>(bytes.numel()), device);
  } catch (const c10::Error& e) {
    throw InputError(
        fmt::format("{}: the optimizer state cannot be loaded: {}", path, first_line_of(e)));
  }
}

std::vector<std::pair<std::string, torch::Tensor*>> elementwise_state(
    torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    return {{"momentum_buffer", &sgd->momentum_buffer()}};
  }
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    return {{"exp_avg", &adam->exp_avg()},
            {"exp_avg_sq", &adam->exp_avg_sq()},
            {"max_exp_avg_sq", &adam->max_exp_avg_sq()}};
  }
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    return {{"exp_avg", &adamw->exp_avg()},
            {"exp_avg_sq", &adamw->exp_avg_sq()},
            {"max_exp_avg_sq", &adamw->max_exp_avg_sq()}};
  }
  throw Error("this optimizer's state cannot be gathered or sharded");
}

std::string optimizer_tensor_key(size_t index, const std::string& name) {
  return fmt::format("{}.{}", index, name);
}

void restore_optimizer_tensors(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::Tensor>& params, const StateDict& tensors,
                               const std::string& path, const c10::Device& device) {
  if (tensors.empty()) return;
  const std::map<std::string, torch::Tensor> by_key(tensors.begin(), tensors.end());
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = optimizer.state().find(compat::optimizer_state_key(optimizer, params[i]));
    if (it == optimizer.state().end()) continue;  // not stepped yet
    for (auto& [name, field] : elementwise_state(*it->second)) {
      auto saved = by_key.find(optimizer_tensor_key(i, name));
      if (saved == by_key.end()) continue;  // in optimizer_state itself
      if (saved->second.numel() != params[i].numel()) {
        throw InputError(fmt::format("{}: optimizer tensor {} has {} elements, its parameter {}",
                                     path, saved->first, saved->second.numel(), params[i].numel()));
      }
      *field = saved->second.view(params[i].sizes())
                   .to(device, params[i].scalar_type(),
                       /*non_blocking=*/false, /*copy=*/true);
    }
  }
}

const at::Tensor& zero_state_of(const Checkpoint& c, const std::string& path, bool zero, int rank) {
  const bool sharded = !c.optimizer_shards.empty();
  if (sharded != zero) {
    throw InputError(fmt::format("{}: saved {} --zero; resume {} it", path,
                                 sharded ? "with" : "without", sharded ? "with" : "without"));
  }
  if (!sharded) return c.optimizer_state;
  return c.optimizer_shards[static_cast<size_t>(rank)];
}

int load_resharded_zero_state(const Checkpoint& c, const std::string& path,
                              const OptimizerFactory& make_optimizer, ZeroRedundancyOptimizer& zero,
                              const std::vector<torch::Tensor>& params, int rank,
                              const c10::Device& device) {
  // Each saved shard into an optimizer over the parameters its rank owned (PyTorch's partition
  // for the saved world), then this rank's parameters' state moved out of them. Element-wise
  // optimizers (SGD, Adam, AdamW) keep state per parameter only, so the new shards hold exactly
  // what the old ones did.
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  const int saved_world = static_cast<int>(c.optimizer_shards.size());
  const std::vector<int> owners = partition_parameters(numels, saved_world);
  torch::optim::Optimizer& local = zero.local();
  for (int q = 0; q < saved_world; ++q) {
    std::vector<torch::Tensor> owned;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owners[i] == q) owned.push_back(params[i]);
    }
    const auto saved = make_optimizer(owned);
    load_optimizer(*saved, c.optimizer_shards[static_cast<size_t>(q)], path, device);
    for (size_t i = 0; i < params.size(); ++i) {
      if (owners[i] != q || zero.owners()[i] != rank) continue;
      auto state = saved->state().find(compat::optimizer_state_key(*saved, params[i]));
      if (state == saved->state().end()) continue;  // not stepped yet: no state
      local.state()[compat::optimizer_state_key(local, params[i])] = std::move(state->second);
    }
  }
  return saved_world;
}

void Digest::add(const at::Tensor& t) {
  if (!t.defined()) return add("-", 1);
  const at::Tensor c = t.detach().cpu().contiguous();
  add(c.data_ptr(), c.nbytes());
}

void add_optimizer_state(Digest& d, const torch::optim::Optimizer& optimizer,
                         const std::vector<torch::Tensor>& parameters) {
  const auto& state = optimizer.state();
  for (const auto& p : parameters) {
    const auto it = state.find(compat::optimizer_state_key(optimizer, p));
    if (it == state.end()) {
      d.add("none", 4);
      continue;
    }
    const torch::optim::OptimizerParamState* s = it->second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      d.add(sgd->momentum_buffer());
    } else if (!add_adam_state<torch::optim::AdamParamState>(d, s) &&
               !add_adam_state<torch::optim::AdamWParamState>(d, s)) {
      throw Error("elastic: the state of this optimizer cannot be compared across ranks");
    }
  }
}

}  // namespace ddp::train
