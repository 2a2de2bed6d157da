#include "sharded_model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/train/pt_file.h"
#include "torch_compat.h"

namespace ddp::train {
namespace {

// A stand-in for each of `module`'s parameters, by name, in an optimizer over the unsharded model
// whose state is saved or loaded: only its identity counts (an optimizer keys its state by
// parameter, and its serialization by position), so it holds no elements.
std::map<std::string, torch::Tensor> stand_ins(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : module.named_parameters()) {
    tensors[item.key()] = torch::empty({0}, item.value().options());
  }
  return tensors;
}

std::vector<torch::Tensor> in_module_order(const torch::nn::Module& module,
                                           const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<torch::Tensor> ordered;
  for (const auto& item : module.named_parameters()) ordered.push_back(tensors.at(item.key()));
  return ordered;
}

// Each parameter's position in the module's order, by name.
std::map<std::string, size_t> indices(const torch::nn::Module& module) {
  std::map<std::string, size_t> index;
  for (const auto& item : module.named_parameters()) index.emplace(item.key(), index.size());
  return index;
}

}  // namespace

ShardedModel::ShardedModel(const Workload& workload, std::shared_ptr<comm::ProcessGroup> group,
                           FullyShardOptions options)
    : module_(workload.module), group_(std::move(group)) {
  model_ = std::make_unique<FullyShardedDataParallel>(module_, workload.units, group_, options);
}

void ShardedModel::broadcast_buffers() {
  broadcast_coalesced(*group_, module_->buffers());  // one broadcast per dtype
}

void ShardedModel::load_state_dict(const StateDict& weights, const std::string& origin) {
  model_->load_state_dict(fitted_state_dict(*module_, weights, origin));
}

ShardedModel::Deferred ShardedModel::deferred_state(const std::string& prefix,
                                                    torch::optim::Optimizer* local,
                                                    const OptimizerFactory& make) const {
  Deferred state;
  state.prefix = prefix;
  // A tied weight is one placeholder under each of its names, as it is one tensor in the module.
  std::map<const void*, torch::Tensor> placeholders;
  for (const auto& [name, value] : model_->state_dict_keys()) {
    torch::Tensor tensor;
    if (!value.is_meta()) {
      tensor = value.detach().clone();  // a buffer: this rank's
    } else {
      auto& p = placeholders[value.unsafeGetTensorImpl()];
      if (!p.defined()) p = PtFileWriter::deferred(value.sizes(), value.scalar_type());
      tensor = p;
    }
    state.model.emplace_back(prefix + name, tensor);
  }
  if (local == nullptr) return state;

  const auto whole = stand_ins(*module_);
  const auto index = indices(*module_);
  const auto unsharded = make(in_module_order(*module_, whole));
  const std::vector<torch::Tensor> shards = model_->parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    auto it = local->state().find(compat::optimizer_state_key(*local, shards[u]));
    if (it == local->state().end()) continue;  // not stepped yet (on every rank alike)
    const auto params = module_->named_parameters();
    for (const auto& name : model_->parameter_names(u)) {
      auto saved = it->second->clone();
      for (auto& [field, tensor] : elementwise_state(*saved)) {
        if (!tensor->defined()) continue;  // AMSGrad's maximum, off
        const torch::Tensor& param = params[name];
        state.optimizer_tensors.emplace_back(
            optimizer_tensor_key(index.at(name), field),
            PtFileWriter::deferred(param.sizes(), tensor->scalar_type()));
        *tensor = torch::empty({0}, tensor->options());  // kept apart
      }
      unsharded->state()[compat::optimizer_state_key(*unsharded, whole.at(name))] =
          std::move(saved);
    }
  }
  state.optimizer_state = serialized(*unsharded);
  return state;
}

void ShardedModel::write_gathered(const Deferred& state, torch::optim::Optimizer* local,
                                  const DeferredWrite& write) {
  const std::map<std::string, torch::Tensor> model(state.model.begin(), state.model.end());
  const std::map<std::string, torch::Tensor> tensors(state.optimizer_tensors.begin(),
                                                     state.optimizer_tensors.end());
  const auto index = indices(*module_);
  model_->gather_each_unit([&](const std::string& name, const torch::Tensor& value) {
    if (write) write(model.at(state.prefix + name), value);
  });
  if (local == nullptr) return;
  const std::vector<torch::Tensor> shards = model_->parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    auto it = local->state().find(compat::optimizer_state_key(*local, shards[u]));
    if (it == local->state().end()) continue;  // not stepped yet (on every rank alike)
    for (const auto& [field, tensor] : elementwise_state(*it->second)) {
      if (!tensor->defined()) continue;
      for (const auto& [name, value] : model_->unshard(u, *tensor)) {  // a collective
        if (write) write(tensors.at(optimizer_tensor_key(index.at(name), field)), value);
      }
    }
  }
}

void ShardedModel::load_unsharded_optimizer_state(torch::optim::Optimizer& local,
                                                  const at::Tensor& state, const StateDict& tensors,
                                                  const OptimizerFactory& make,
                                                  const std::string& path) {
  std::map<std::string, torch::Tensor> whole = stand_ins(*module_);
  const auto index = indices(*module_);
  const auto unsharded = make(in_module_order(*module_, whole));
  load_optimizer(*unsharded, state, path, whole.begin()->second.device());
  const std::map<std::string, torch::Tensor> apart(tensors.begin(), tensors.end());
  const auto params = module_->named_parameters();
  const std::vector<torch::Tensor> shards = model_->parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    const auto names = model_->parameter_names(u);
    std::vector<torch::optim::OptimizerParamState*> saved;
    for (const auto& name : names) {
      auto it = unsharded->state().find(compat::optimizer_state_key(*unsharded, whole.at(name)));
      if (it != unsharded->state().end()) saved.push_back(it->second.get());
    }
    if (saved.size() != names.size()) continue;  // not stepped: no state
    auto mine = saved.front()->clone();
    auto targets = elementwise_state(*mine);
    for (size_t f = 0; f < targets.size(); ++f) {
      const std::string& field = targets[f].first;
      std::vector<torch::Tensor> parts;
      for (size_t p = 0; p < names.size(); ++p) {
        auto kept = apart.find(optimizer_tensor_key(index.at(names[p]), field));
        parts.push_back(kept != apart.end() ? kept->second
                                            : *elementwise_state(*saved[p])[f].second);
        if (parts.back().defined() && parts.back().numel() != params[names[p]].numel()) {
          throw InputError(
              fmt::format("{}: the optimizer's {} of {} has {} elements, the "
                          "parameter {}",
                          path, field, names[p], parts.back().numel(), params[names[p]].numel()));
        }
      }
      *targets[f].second = parts.front().defined() ? model_->shard(u, parts) : torch::Tensor();
    }
    local.state()[compat::optimizer_state_key(local, shards[u])] = std::move(mine);
  }
}

std::vector<torch::Tensor> ShardedModel::shard_copies() const {
  std::vector<torch::Tensor> copies;
  for (const auto& shard : model_->parameters()) copies.push_back(shard.detach().clone());
  return copies;
}

StateDict ShardedModel::buffer_copies(const std::string& prefix) const {
  StateDict buffers;
  for (const auto& item : module_->named_buffers()) {
    buffers.emplace_back(prefix + item.key(), item.value().detach().clone());
  }
  return buffers;
}

std::vector<torch::Tensor> ShardedModel::unit_values(int unit,
                                                     const std::vector<torch::Tensor>& parts,
                                                     const std::string& path) const {
  const auto flat = torch::cat(parts);
  const auto params = module_->named_parameters();
  std::vector<torch::Tensor> values;
  int64_t offset = 0;
  for (const auto& name : model_->parameter_names(unit)) {
    const auto& like = params[name];
    if (offset + like.numel() > flat.numel()) {
      throw InputError(fmt::format(
          "{}: the shards of unit {} hold {} elements, fewer than this model's parameters up to "
          "{}: a checkpoint of another model",
          path, unit, flat.numel(), name));
    }
    values.push_back(flat.narrow(0, offset, like.numel()).view(like.sizes()));
    offset += like.numel();
  }
  return values;
}

void ShardedModel::load_shards(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                               const OptimizerFactory& make, const std::string& path) {
  const int units = model_->num_units();
  if (static_cast<int>(files.front().parameter_shards.size()) != units) {
    throw InputError(fmt::format("{}: shards of {} units; this model has {}", path,
                                 files.front().parameter_shards.size(), units));
  }
  StateDict weights = files.front().model;  // rank 0's buffers
  for (int u = 0; u < units; ++u) {
    std::vector<torch::Tensor> parts;
    for (const auto& file : files) parts.push_back(file.parameter_shards[u]);
    const auto values = unit_values(u, parts, path);
    const auto names = model_->parameter_names(u);
    for (size_t i = 0; i < names.size(); ++i) weights.emplace_back(names[i], values[i]);
  }
  load_state_dict(weights, path);
  load_shard_optimizers(files, local, make, path);
}

// Each saved rank's optimizer read back over stand-ins of its shards, then, unit by unit, each
// element-wise state put together from theirs and cut to this rank's part; the rest of a unit's
// state (Adam's step count, the same everywhere) is rank 0's.
void ShardedModel::load_shard_optimizers(const std::vector<Checkpoint>& files,
                                         torch::optim::Optimizer& local,
                                         const OptimizerFactory& make, const std::string& path) {
  std::vector<std::vector<torch::Tensor>> stand_ins_of(files.size());
  std::vector<std::unique_ptr<torch::optim::Optimizer>> saved;
  for (size_t r = 0; r < files.size(); ++r) {
    for (const auto& shard : files[r].parameter_shards) {
      stand_ins_of[r].push_back(torch::zeros_like(shard));
    }
    saved.push_back(make(stand_ins_of[r]));
    load_optimizer(*saved.back(), files[r].optimizer_state, path, stand_ins_of[r][0].device());
  }
  const std::vector<torch::Tensor> shards = model_->parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    std::vector<torch::optim::OptimizerParamState*> states;
    for (size_t r = 0; r < files.size(); ++r) {
      auto it = saved[r]->state().find(compat::optimizer_state_key(*saved[r], stand_ins_of[r][u]));
      if (it != saved[r]->state().end()) states.push_back(it->second.get());
    }
    if (states.size() != files.size()) continue;  // not stepped: no state
    auto mine = states.front()->clone();
    auto targets = elementwise_state(*mine);
    for (size_t f = 0; f < targets.size(); ++f) {
      if (!elementwise_state(*states.front())[f].second->defined()) continue;
      std::vector<torch::Tensor> parts;
      for (auto* state : states) parts.push_back(*elementwise_state(*state)[f].second);
      *targets[f].second = model_->shard(u, unit_values(u, parts, path));
    }
    local.state()[compat::optimizer_state_key(local, shards[u])] = std::move(mine);
  }
}

}  // namespace ddp::train
