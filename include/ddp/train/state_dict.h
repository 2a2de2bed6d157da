#pragma once
// Model weights in Python's naming: state dicts, the `module.` prefix of nn.DataParallel and
// DistributedDataParallel, and weights files that Python loads and saves.
//
// Saving writes what Python reads with torch.load(path) (weights_only=True) and loads with
// strict=True into nn.DataParallel(model). Loading accepts keys with or without `module.`,
// tensors saved on any device, a plain dict or an OrderedDict (torch.save(model.state_dict())),
// and checkpoints holding the weights under "model" or "state_dict".

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace ddp::train {

// Names and tensors in the order of Python's Module.state_dict(): each module's parameters, then
// its buffers, then its children's.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// nn.DataParallel's prefix.
inline const std::string kModulePrefix = "module.";

// The live tensors of `module`, each name prefixed with `prefix`.
StateDict state_dict(const torch::nn::Module& module, const std::string& prefix = "");

// Keys that do not line up between a model and a file.
struct ShapeMismatch {
  std::string key;
  std::vector<int64_t> model_shape;
  std::vector<int64_t> file_shape;
};
struct KeyMismatch {
  std::vector<std::string> missing;     // in the model, not in the file
  std::vector<std::string> unexpected;  // in the file, not in the model
  std::vector<ShapeMismatch> shapes;
  bool empty() const { return missing.empty() && unexpected.empty() && shapes.empty(); }
};

// A key and its tensor's shape.
using KeyShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The number of `module.` prefixes that every key has (0 when not all have one).
size_t common_module_prefixes(const std::vector<std::string>& keys);

// Matches a file's keys against a model's, both without their common `module.` prefixes.
KeyMismatch compare_keys(const KeyShapes& model, const KeyShapes& file);

// "3 missing key(s): a, b, c; 1 unexpected key(s): ...; ..." listing at most `max_listed` of each.
std::string describe(const KeyMismatch& mismatch, size_t max_listed = 10);

// `weights` in `module`'s order and under its own names (without `module.`), after checking that
// keys and shapes match exactly (strict=True): InputError starting with `origin` on a mismatch,
// listing the keys. Reads only the names and shapes of `module`'s tensors.
StateDict fitted_state_dict(const torch::nn::Module& module, const StateDict& weights,
                            const std::string& origin);

// Copies `weights` into `module` (the tensors keep their device, dtype and identity), after
// checking that keys and shapes match exactly (strict=True). Throws InputError starting with
// `origin` on a mismatch, listing the keys.
void load_state_dict(torch::nn::Module& module, const StateDict& weights,
                     const std::string& origin);

// The state dict in a file's contents: the top-level dict, or its "model" or "state_dict" entry.
// Throws InputError starting with `origin` when it is not a dict of string keys to tensors.
StateDict state_dict_from(const c10::IValue& contents, const std::string& origin);

// A dict of CPU copies of the tensors, ready for serialize_pt (a PtFileWriter's placeholder as
// it is).
c10::IValue to_ivalue(const StateDict& weights);

// Writes the weights of `module` to `path` (atomically), keys prefixed with `prefix`
// (kModulePrefix: as nn.DataParallel(model).state_dict() names them; "": as model.state_dict()).
void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::string& prefix = kModulePrefix);

// The same of `weights` (with or without `module.` prefixes: those are replaced by `prefix`).
void save_weights(const StateDict& weights, const std::string& path,
                  const std::string& prefix = kModulePrefix);

// `weights` keyed with `prefix` instead of the `module.` prefixes they have or not.
StateDict with_prefix(const StateDict& weights, const std::string& prefix);

// Loads a weights file (ours or Python's) into `module`, as load_state_dict.
void load_weights(torch::nn::Module& module, const std::string& path);

}  // namespace ddp::train
