#include "ddp/train/sharded_checkpoint.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>

#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/sharded_weights.h"
#include "optimizer_state.h"
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

// Calls `each(u, state)` for each unit u whose shard `local` has stepped (a unit not stepped yet
// has no state, on every rank alike). Every reshaping of the optimizer's state that starts from
// this rank's shards (a gathered save's, a sharded save's) goes through here, and so does the
// loaded state's completion with the tensors a sharded file keeps apart. `Optimizer` is const or
// not, as `each` only reads the state or also writes it.
template <class Optimizer, class Each>
void for_each_unit_state(Optimizer& local, const std::vector<torch::Tensor>& shards, Each each) {
  for (size_t u = 0; u < shards.size(); ++u) {
    auto it = local.state().find(compat::optimizer_state_key(local, shards[u]));
    if (it != local.state().end()) each(u, *it->second);
  }
}

// A sharded file's element-wise optimizer tensors, kept apart (`tensors`, keyed by unit), into
// the state `saved` (over `stand_ins`, one per unit) was just loaded with: the tensors as they lie
// (views of the mapped file), of which take_saved_part reads only the overlap.
void attach_kept_apart(torch::optim::Optimizer& saved, const std::vector<torch::Tensor>& stand_ins,
                       const StateDict& tensors) {
  if (tensors.empty()) return;  // a file that keeps them in its optimizer_state
  const std::map<std::string, torch::Tensor> by_key(tensors.begin(), tensors.end());
  for_each_unit_state(saved, stand_ins, [&](size_t u, auto& unit_state) {
    for (auto& [field, tensor] : elementwise_state(unit_state)) {
      auto kept = by_key.find(optimizer_tensor_key(u, field));
      if (kept != by_key.end()) *tensor = kept->second;
    }
  });
}

// Copies into `into`, the elements [into_begin, into_begin + into.numel()) of a unit's flat
// buffer, those of `from`, the elements [from_begin, ...), that both hold: the rest of `from` is
// not read (a saved shard may be a view of a mapped file).
void copy_overlap(const torch::Tensor& into, int64_t into_begin, const torch::Tensor& from,
                  int64_t from_begin) {
  const int64_t first = std::max(into_begin, from_begin);
  const int64_t last = std::min(into_begin + into.numel(), from_begin + from.numel());
  if (first >= last) return;
  torch::NoGradGuard no_grad;
  into.narrow(0, first - into_begin, last - first)
      .copy_(from.narrow(0, first - from_begin, last - first));
}

// Into `into`, this rank's element-wise optimizer state of one unit (laid out as `shard`, the
// unit's flat elements from `begin`; `fields`: which of its tensors it has), what it shares with
// `from`, a saved rank's (its flat elements from `from_begin`, `from_numel` of them): the saved
// tensor itself where it is exactly this rank's part, else a copy of the overlap into a tensor
// made at the first need. InputError starting with `what` when `from` is not of a shard's size.
void take_saved_part(torch::optim::OptimizerParamState& into, const std::vector<bool>& fields,
                     const torch::Tensor& shard, int64_t begin,
                     torch::optim::OptimizerParamState& from, int64_t from_begin,
                     int64_t from_numel, const std::string& what) {
  const auto saved = elementwise_state(from);
  const auto mine = elementwise_state(into);
  for (size_t f = 0; f < mine.size(); ++f) {
    if (!fields[f]) continue;
    const torch::Tensor& part = *saved[f].second;
    if (!part.defined() || part.numel() != from_numel) {
      throw InputError(fmt::format("{}: {} is not of its shard's size", what, saved[f].first));
    }
    torch::Tensor& target = *mine[f].second;
    if (from_numel == shard.numel() && from_begin == begin) {
      target = part.view(shard.sizes());  // exactly this rank's shard
      continue;
    }
    if (!target.defined()) target = torch::zeros_like(shard);
    copy_overlap(target, begin, part.reshape(-1), from_begin);
  }
}

// The tensors `into` has (`fields`) that no saved part made: zeros laid out as `shard` (a shard
// that is all padding overlaps no saved one).
void zeros_where_unmade(torch::optim::OptimizerParamState& into, const std::vector<bool>& fields,
                        const torch::Tensor& shard) {
  const auto mine = elementwise_state(into);
  for (size_t f = 0; f < mine.size(); ++f) {
    if (fields[f] && !mine[f].second->defined()) *mine[f].second = torch::zeros_like(shard);
  }
}

// The element-wise tensors `state` holds, by name (AMSGrad's maximum, off, is not among them).
std::vector<std::pair<std::string, torch::Tensor*>> defined_fields(
    torch::optim::OptimizerParamState& state) {
  std::vector<std::pair<std::string, torch::Tensor*>> fields;
  for (const auto& field : elementwise_state(state)) {
    if (field.second->defined()) fields.push_back(field);
  }
  return fields;
}

// Each parameter's position in the module's order, by name.
std::map<std::string, size_t> indices(const torch::nn::Module& module) {
  std::map<std::string, size_t> index;
  for (const auto& item : module.named_parameters()) index.emplace(item.key(), index.size());
  return index;
}

}  // namespace

ShardedState::ShardedState(FullyShardedDataParallel& model,
                           std::shared_ptr<comm::ProcessGroup> group)
    : model_(model), module_(model.module()), group_(std::move(group)) {}

void ShardedState::load_state_dict(const StateDict& weights, const std::string& origin) {
  model_.load_state_dict(fitted_state_dict(module_, weights, origin));
}

ShardedState::Deferred ShardedState::deferred_state(const std::string& prefix,
                                                    torch::optim::Optimizer* local,
                                                    const OptimizerFactory& make) const {
  Deferred state;
  state.prefix = prefix;
  state.model = deferred_state_dict(model_, prefix);
  if (local == nullptr) return state;

  const auto whole = stand_ins(module_);
  const auto index = indices(module_);
  const auto unsharded = make(in_module_order(module_, whole));
  const auto params = module_.named_parameters();
  for_each_unit_state(*local, model_.parameters(), [&](size_t u, auto& unit_state) {
    for (const auto& name : model_.parameter_names(static_cast<int>(u))) {
      auto saved = unit_state.clone();
      for (auto& [field, tensor] : defined_fields(*saved)) {
        state.optimizer_tensors.emplace_back(
            optimizer_tensor_key(index.at(name), field),
            PtFileWriter::deferred(params[name].sizes(), tensor->scalar_type()));
        *tensor = torch::empty({0}, tensor->options());  // kept apart
      }
      unsharded->state()[compat::optimizer_state_key(*unsharded, whole.at(name))] =
          std::move(saved);
    }
  });
  state.optimizer_state = serialized(*unsharded);
  return state;
}

void ShardedState::write_gathered(const Deferred& state, torch::optim::Optimizer* local,
                                  const DeferredWrite& write) {
  const std::map<std::string, torch::Tensor> tensors(state.optimizer_tensors.begin(),
                                                     state.optimizer_tensors.end());
  const auto index = indices(module_);
  write_gathered_parameters(model_, state.model, state.prefix, write);
  if (local == nullptr) return;
  for_each_unit_state(*local, model_.parameters(), [&](size_t u, auto& unit_state) {
    for (const auto& [field, tensor] : defined_fields(unit_state)) {
      for (const auto& [name, value] :
           model_.unshard(static_cast<int>(u), *tensor)) {  // a collective
        if (write) write(tensors.at(optimizer_tensor_key(index.at(name), field)), value);
      }
    }
  });
}

void ShardedState::load_unsharded_optimizer_state(torch::optim::Optimizer& local,
                                                  const at::Tensor& state, const StateDict& tensors,
                                                  const OptimizerFactory& make,
                                                  const std::string& path) {
  std::map<std::string, torch::Tensor> whole = stand_ins(module_);
  const auto index = indices(module_);
  const auto unsharded = make(in_module_order(module_, whole));
  load_optimizer(*unsharded, state, path, whole.begin()->second.device());
  const std::map<std::string, torch::Tensor> apart(tensors.begin(), tensors.end());
  const auto params = module_.named_parameters();
  const std::vector<torch::Tensor> shards = model_.parameters();
  for (int u = 0; u < static_cast<int>(shards.size()); ++u) {
    const auto names = model_.parameter_names(u);
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
      *targets[f].second = parts.front().defined() ? model_.shard(u, parts) : torch::Tensor();
    }
    local.state()[compat::optimizer_state_key(local, shards[u])] = std::move(mine);
  }
}

void ShardedState::fill_rank_file(Checkpoint& c, const torch::optim::Optimizer& local,
                                  const OptimizerFactory& make, bool copy) const {
  auto kept = [copy](const torch::Tensor& t) { return copy ? t.detach().clone() : t.detach(); };
  c.shard_rank = group_->rank();
  for (const auto& item : module_.named_buffers()) {
    c.model.emplace_back(item.key(), item.value().detach().clone());
  }
  for (const auto& shard : model_.flat_shards()) c.parameter_shards.push_back(kept(shard));
  // An optimizer over stand-ins of the shards (as load_shard_optimizers reads it back) holding
  // `local`'s state with the element-wise tensors left empty: its serialization is small.
  const std::vector<torch::Tensor> shards = model_.parameters();
  std::vector<torch::Tensor> stand_ins;
  for (const auto& shard : shards) stand_ins.push_back(torch::empty({0}, shard.options()));
  const auto apart = make(stand_ins);
  for_each_unit_state(local, shards, [&](size_t u, auto& unit_state) {
    auto saved = unit_state.clone();  // its tensors shared, not copied
    for (auto& [field, tensor] : defined_fields(*saved)) {
      c.optimizer_tensors.emplace_back(optimizer_tensor_key(u, field), kept(*tensor));
      *tensor = torch::empty({0}, tensor->options());
    }
    apart->state()[compat::optimizer_state_key(*apart, stand_ins[u])] = std::move(saved);
  });
  c.optimizer_state = byte_tensor(serialized(*apart));
}

void ShardedState::load_shards(const std::vector<Checkpoint>& files, torch::optim::Optimizer& local,
                               const OptimizerFactory& make, const std::string& path) {
  // Each unit's shard, then the frozen parts' (FullyShardedDataParallel::flat_shards).
  const std::vector<torch::Tensor> shards = model_.flat_shards();
  const int units = static_cast<int>(shards.size());
  if (static_cast<int>(files.front().parameter_shards.size()) != units) {
    throw InputError(fmt::format("{}: shards of {} flat buffers; this model has {}", path,
                                 files.front().parameter_shards.size(), units));
  }
  torch::NoGradGuard no_grad;
  const auto params = module_.named_parameters();
  for (int u = 0; u < units; ++u) {
    int64_t numel = 0;
    for (const auto& name : model_.flat_shard_names(u)) numel += params[name].numel();
    const int64_t saved = files.front().parameter_shards[u].numel();
    const auto saved_world = static_cast<int64_t>(files.size());
    if (saved != (numel + saved_world - 1) / saved_world) {  // plan_flat_layout's shard
      throw InputError(fmt::format(
          "{}: the shards of unit {} are of {} elements each, not of a unit of {} on {} ranks: a "
          "checkpoint of another model",
          path, u, saved, numel, saved_world));
    }
    shards[u].zero_();
    for (size_t r = 0; r < files.size(); ++r) {
      copy_overlap(shards[u], begin_of(u), files[r].parameter_shards[u].reshape(-1),
                   static_cast<int64_t>(r) * saved);
    }
  }
  // The buffers (BatchNorm's statistics): rank 0's.
  const std::map<std::string, torch::Tensor> buffers(files.front().model.begin(),
                                                     files.front().model.end());
  for (auto& item : module_.named_buffers()) {
    auto it = buffers.find(item.key());
    if (it == buffers.end() || it->second.sizes() != item.value().sizes()) {
      throw InputError(fmt::format("{}: {} buffer {}", path,
                                   it == buffers.end() ? "no" : "a wrongly shaped", item.key()));
    }
    item.value().copy_(it->second);
  }
  load_shard_optimizers(files, local, make, path);
}

int64_t ShardedState::begin_of(int unit) const {
  return group_->rank() * model_.flat_shards()[static_cast<size_t>(unit)].numel();
}

// The saved ranks' optimizers whose shards overlap this rank's read back in turn (over stand-ins
// of their shards), and the part of each element-wise state that falls in this rank's shard taken:
// the saved tensor itself where it is exactly this rank's shard (a resume on as many ranks), else
// a copy of the overlap. The rest of a unit's state (Adam's step count) is the same on every rank.
// One saved rank's optimizer in memory at a time.
void ShardedState::load_shard_optimizers(const std::vector<Checkpoint>& files,
                                         torch::optim::Optimizer& local,
                                         const OptimizerFactory& make, const std::string& path) {
  const std::vector<torch::Tensor> shards = model_.parameters();
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> mine(shards.size());
  std::vector<bool> stepped(shards.size(), true);        // false: a saved rank has no state for it
  std::vector<std::vector<bool>> fields(shards.size());  // which element-wise tensors it has
  for (size_t r = 0; r < files.size(); ++r) {
    const auto& saved_shards = files[r].parameter_shards;
    auto overlaps = [&](size_t u) {
      const int64_t begin = begin_of(static_cast<int>(u)), n = saved_shards[u].numel();
      return static_cast<int64_t>(r) * n < begin + shards[u].numel() &&
             begin < static_cast<int64_t>(r + 1) * n;
    };
    bool needed = false;
    for (size_t u = 0; u < shards.size(); ++u) needed = needed || overlaps(u);
    if (!needed) continue;
    std::vector<torch::Tensor> stand_ins;  // the optimizer's: the units' shards, not frozen parts
    for (size_t u = 0; u < shards.size(); ++u) {
      stand_ins.push_back(torch::empty({0}, saved_shards[u].options()));
    }
    const auto saved = make(stand_ins);
    load_optimizer(*saved, files[r].optimizer_state, path, shards.front().device());
    attach_kept_apart(*saved, stand_ins, files[r].optimizer_tensors);
    for (size_t u = 0; u < shards.size(); ++u) {
      if (!overlaps(u) || !stepped[u]) continue;
      auto it = saved->state().find(compat::optimizer_state_key(*saved, stand_ins[u]));
      if (it == saved->state().end()) {
        stepped[u] = false;  // not stepped (on every rank alike): no state
        continue;
      }
      if (!mine[u]) {  // its element-wise tensors made as the saved parts come
        mine[u] = it->second->clone();
        for (auto& [field, tensor] : elementwise_state(*mine[u])) {
          fields[u].push_back(tensor->defined());
          *tensor = torch::Tensor();
        }
      }
      const int64_t n = saved_shards[u].numel();
      take_saved_part(*mine[u], fields[u], shards[u], begin_of(static_cast<int>(u)), *it->second,
                      static_cast<int64_t>(r) * n, n,
                      fmt::format("{}: rank {}'s optimizer state of unit {}", path, r, u));
    }
  }
  for (size_t u = 0; u < shards.size(); ++u) {
    if (!mine[u] || !stepped[u]) continue;
    zeros_where_unmade(*mine[u], fields[u], shards[u]);
    local.state()[compat::optimizer_state_key(local, shards[u])] = std::move(mine[u]);
  }
}

}  // namespace ddp::train
