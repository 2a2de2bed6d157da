#include "sharded_model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "torch_compat.h"

namespace ddp::train {
namespace {

// The tensors of a parameter's optimizer state that follow its elements (SGD's momentum buffer,
// Adam's and AdamW's moments); the rest (Adam's step count) is one value per parameter. Error for
// the state of an optimizer make_optimizer() does not build.
std::vector<torch::Tensor*> elementwise(torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    return {&sgd->momentum_buffer()};
  }
  if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(&state)) {
    return {&adam->exp_avg(), &adam->exp_avg_sq(), &adam->max_exp_avg_sq()};
  }
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    return {&adamw->exp_avg(), &adamw->exp_avg_sq(), &adamw->max_exp_avg_sq()};
  }
  throw Error("--fsdp: this optimizer's state cannot be gathered or sharded");
}

// Zero tensors shaped as `module`'s parameters, by name: what an optimizer over the unsharded
// model steps, for its state to be saved or loaded.
std::map<std::string, torch::Tensor> stand_ins(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : module.named_parameters()) {
    tensors[item.key()] = torch::zeros(item.value().sizes(), item.value().options());
  }
  return tensors;
}

std::vector<torch::Tensor> in_module_order(const torch::nn::Module& module,
                                           const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<torch::Tensor> ordered;
  for (const auto& item : module.named_parameters()) ordered.push_back(tensors.at(item.key()));
  return ordered;
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

StateDict ShardedModel::state_dict(const std::string& prefix) {
  StateDict state;
  for (auto& [key, tensor] : model_->state_dict()) state.emplace_back(prefix + key, tensor);
  return state;
}

void ShardedModel::load_state_dict(const StateDict& weights, const std::string& origin) {
  model_->load_state_dict(fitted_state_dict(*module_, weights, origin));
}

std::string ShardedModel::unsharded_optimizer_state(torch::optim::Optimizer& local,
                                                    const OptimizerFactory& make) {
  // Every rank gathers (collectives); rank 0 keeps the whole state, in an optimizer over
  // stand-ins of the parameters.
  const bool main = group_->rank() == 0;
  std::map<std::string, torch::Tensor> whole =
      main ? stand_ins(*module_) : std::map<std::string, torch::Tensor>();
  const auto unsharded = main ? make(in_module_order(*module_, whole)) : nullptr;
  const std::vector<torch::Tensor> shards = model_->parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    auto it = local.state().find(compat::optimizer_state_key(local, shards[u]));
    if (it == local.state().end()) continue;  // not stepped yet (on every rank alike)
    std::vector<std::vector<std::pair<std::string, torch::Tensor>>> fields;
    for (torch::Tensor* field : elementwise(*it->second)) {
      fields.push_back(field->defined() ? model_->unshard(u, *field)
                                        : std::vector<std::pair<std::string, torch::Tensor>>());
    }
    if (!main) continue;
    const auto names = model_->parameter_names(u);
    for (size_t p = 0; p < names.size(); ++p) {
      auto state = it->second->clone();
      auto targets = elementwise(*state);
      for (size_t f = 0; f < fields.size(); ++f) {
        *targets[f] = fields[f].empty() ? torch::Tensor() : fields[f][p].second;
      }
      unsharded->state()[compat::optimizer_state_key(*unsharded, whole.at(names[p]))] =
          std::move(state);
    }
  }
  return main ? serialized(*unsharded) : std::string();
}

void ShardedModel::load_unsharded_optimizer_state(torch::optim::Optimizer& local,
                                                  const at::Tensor& state,
                                                  const OptimizerFactory& make,
                                                  const std::string& path) {
  std::map<std::string, torch::Tensor> whole = stand_ins(*module_);
  const auto unsharded = make(in_module_order(*module_, whole));
  load_optimizer(*unsharded, state, path, whole.begin()->second.device());
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
    auto targets = elementwise(*mine);
    for (size_t f = 0; f < targets.size(); ++f) {
      std::vector<torch::Tensor> parts;
      for (auto* s : saved) parts.push_back(*elementwise(*s)[f]);
      const bool defined = parts.front().defined();
      *targets[f] = defined ? model_->shard(u, parts) : torch::Tensor();
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
    auto targets = elementwise(*mine);
    for (size_t f = 0; f < targets.size(); ++f) {
      if (!elementwise(*states.front())[f]->defined()) continue;
      std::vector<torch::Tensor> parts;
      for (auto* state : states) parts.push_back(*elementwise(*state)[f]);
      *targets[f] = model_->shard(u, unit_values(u, parts, path));
    }
    local.state()[compat::optimizer_state_key(local, shards[u])] = std::move(mine);
  }
}

}  // namespace ddp::train
