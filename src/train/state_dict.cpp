#include "ddp/train/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>

#include "ddp/common/error.h"
#include "ddp/train/pt_file.h"

namespace ddp::train {
namespace {

void append_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    out.emplace_back(prefix + p.key(), p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    out.emplace_back(prefix + b.key(), b.value());
  }
  for (const auto& child : module.named_children()) {
    append_state(*child.value(), prefix + child.key() + ".", out);
  }
}

std::vector<std::string> keys_of(const KeyShapes& entries) {
  std::vector<std::string> keys;
  for (const auto& e : entries) keys.push_back(e.first);
  return keys;
}

KeyShapes shapes_of(const StateDict& weights) {
  KeyShapes out;
  for (const auto& [key, tensor] : weights) out.emplace_back(key, tensor.sizes().vec());
  return out;
}

std::string listed(const std::vector<std::string>& items, size_t max_listed) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_listed; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > max_listed) out += fmt::format(", ... ({} more)", items.size() - max_listed);
  return out;
}

// `weights` without the `module.` prefixes all its keys share.
StateDict without_module_prefixes(StateDict weights) {
  std::vector<std::string> keys;
  for (const auto& w : weights) keys.push_back(w.first);
  const size_t strip = common_module_prefixes(keys) * kModulePrefix.size();
  for (auto& w : weights) w.first.erase(0, strip);
  return weights;
}

// The state dict of `module` named as the module itself names it (a DDP wrapper's `module.` off).
StateDict own_state_dict(const torch::nn::Module& module) {
  return without_module_prefixes(state_dict(module));
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module, const std::string& prefix) {
  StateDict out;
  append_state(module, prefix, out);
  return out;
}

size_t common_module_prefixes(const std::vector<std::string>& keys) {
  if (keys.empty()) return 0;
  size_t depth = 0;
  while (true) {
    const size_t at = depth * kModulePrefix.size();
    for (const auto& key : keys) {
      if (key.size() <= at + kModulePrefix.size() ||
          key.compare(at, kModulePrefix.size(), kModulePrefix) != 0) {
        return depth;
      }
    }
    ++depth;
  }
}

KeyMismatch compare_keys(const KeyShapes& model, const KeyShapes& file) {
  const size_t model_strip = common_module_prefixes(keys_of(model)) * kModulePrefix.size();
  const size_t file_strip = common_module_prefixes(keys_of(file)) * kModulePrefix.size();
  std::map<std::string, const std::vector<int64_t>*> in_file;
  for (const auto& [key, shape] : file) in_file[key.substr(file_strip)] = &shape;

  KeyMismatch out;
  std::map<std::string, bool> seen;
  for (const auto& [full_key, shape] : model) {
    const std::string key = full_key.substr(model_strip);
    seen[key] = true;
    auto it = in_file.find(key);
    if (it == in_file.end()) {
      out.missing.push_back(key);
    } else if (*it->second != shape) {
      out.shapes.push_back({key, shape, *it->second});
    }
  }
  for (const auto& [full_key, shape] : file) {
    const std::string key = full_key.substr(file_strip);
    if (!seen.count(key)) out.unexpected.push_back(key);
  }
  return out;
}

std::string describe(const KeyMismatch& m, size_t max_listed) {
  std::vector<std::string> parts;
  if (!m.missing.empty()) {
    parts.push_back(
        fmt::format("{} missing key(s): {}", m.missing.size(), listed(m.missing, max_listed)));
  }
  if (!m.unexpected.empty()) {
    parts.push_back(fmt::format("{} unexpected key(s): {}", m.unexpected.size(),
                                listed(m.unexpected, max_listed)));
  }
  if (!m.shapes.empty()) {
    std::vector<std::string> shapes;
    for (const auto& s : m.shapes) {
      shapes.push_back(fmt::format("{} (model [{}], file [{}])", s.key,
                                   fmt::join(s.model_shape, ", "), fmt::join(s.file_shape, ", ")));
    }
    parts.push_back(
        fmt::format("{} key(s) of another shape: {}", m.shapes.size(), listed(shapes, max_listed)));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

StateDict fitted_state_dict(const torch::nn::Module& module, const StateDict& weights,
                            const std::string& origin) {
  const StateDict target = own_state_dict(module);
  const KeyMismatch mismatch = compare_keys(shapes_of(target), shapes_of(weights));
  if (!mismatch.empty()) {
    throw InputError(
        fmt::format("{}: the weights do not fit the model: {}", origin, describe(mismatch)));
  }
  std::map<std::string, torch::Tensor> by_key;
  for (auto& [key, tensor] : without_module_prefixes(weights)) by_key[key] = tensor;
  StateDict fitted;
  for (const auto& entry : target) fitted.emplace_back(entry.first, by_key.at(entry.first));
  return fitted;
}

void load_state_dict(torch::nn::Module& module, const StateDict& weights,
                     const std::string& origin) {
  const StateDict fitted = fitted_state_dict(module, weights, origin);
  // In place, as Python's load_state_dict: optimizers and DDP's bucket views keep pointing at
  // these tensors. copy_ moves the values to the tensor's device and dtype.
  torch::NoGradGuard no_grad;
  const StateDict target = own_state_dict(module);
  for (size_t i = 0; i < target.size(); ++i) target[i].second.copy_(fitted[i].second);
}

StateDict state_dict_from(const c10::IValue& contents, const std::string& origin) {
  if (!contents.isGenericDict()) {
    throw InputError(fmt::format("{}: expected a dict of tensors (a state dict), found a {}",
                                 origin, contents.tagKind()));
  }
  auto dict = contents.toGenericDict();
  // A checkpoint: the weights are one of its entries.
  for (const char* entry : {"model", "state_dict"}) {
    auto it = dict.find(c10::IValue(std::string(entry)));
    if (it != dict.end() && it->value().isGenericDict())
      return state_dict_from(it->value(), origin);
  }
  StateDict out;
  for (const auto& entry : dict) {
    if (!entry.key().isString()) {
      throw InputError(fmt::format("{}: a state dict key is not a string", origin));
    }
    const std::string& key = entry.key().toStringRef();
    if (!entry.value().isTensor()) {
      throw InputError(fmt::format("{}: key '{}' holds a {}, not a tensor", origin, key,
                                   entry.value().tagKind()));
    }
    out.emplace_back(key, entry.value().toTensor());
  }
  return out;
}

c10::IValue to_ivalue(const StateDict& weights) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [key, tensor] : weights) {
    // A tensor is written with its whole storage: one that is exactly its storage, on the CPU,
    // goes as it is (the file is written before the caller goes on, or from copies it made); any
    // other (a view, a GPU tensor) as a CPU copy of its own. A placeholder of a file written as its
    // data comes (PtFileWriter) stays itself.
    if (PtFileWriter::is_deferred(tensor)) {
      dict.insert(key, tensor);
      continue;
    }
    const bool whole_storage = tensor.is_cpu() && tensor.has_storage() && tensor.is_contiguous() &&
                               tensor.storage_offset() == 0 &&
                               tensor.storage().nbytes() == tensor.nbytes();
    dict.insert(key, whole_storage ? tensor.detach()
                                   : tensor.detach().to(torch::kCPU, /*non_blocking=*/false,
                                                        /*copy=*/true));
  }
  return dict;
}

void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::string& prefix) {
  save_weights(state_dict(module), path, prefix);
}

StateDict with_prefix(const StateDict& weights, const std::string& prefix) {
  StateDict named = without_module_prefixes(weights);
  for (auto& w : named) w.first = prefix + w.first;
  return named;
}

void save_weights(const StateDict& weights, const std::string& path, const std::string& prefix) {
  write_pt_file(path, to_ivalue(with_prefix(weights, prefix)));
}

void load_weights(torch::nn::Module& module, const std::string& path) {
  load_state_dict(module, state_dict_from(read_pt_file(path), path), path);
}

}  // namespace ddp::train
