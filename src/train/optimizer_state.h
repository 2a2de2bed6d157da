#pragma once
// An optimizer's state (private to the train layer): as bytes in a checkpoint and back, --zero's
// shards of another world size, and a digest of it that every process computes alike. Used by
// TrainState (train_state.h).

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/zero_redundancy_optimizer.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/sharded_checkpoint.h"  // OptimizerFactory

namespace ddp::train {

// The optimizer's own serialization (torch::save), as a checkpoint's optimizer_state holds it.
std::string serialized(const torch::optim::Optimizer& optimizer);
at::Tensor byte_tensor(const std::string& bytes);  // uint8, a copy
at::Tensor byte_tensor(std::string&& bytes);       // uint8, owning the bytes (no copy)

// `optimizer` from its serialized `state`, onto `device` (InputError naming `path` when it does
// not fit).
void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& state,
                    const std::string& path, const c10::Device& device);

// The tensors of a parameter's state that follow its elements (SGD's momentum buffer, Adam's and
// AdamW's moments), by name; the rest (Adam's step count) is one value per parameter. Error for
// the state of an optimizer make_optimizer() does not build.
std::vector<std::pair<std::string, torch::Tensor*>> elementwise_state(
    torch::optim::OptimizerParamState& state);
// A checkpoint's optimizer_tensors key of parameter `index`'s (in the model's order) tensor `name`.
std::string optimizer_tensor_key(size_t index, const std::string& name);
// A checkpoint's optimizer_tensors (its element-wise state kept apart from optimizer_state, as a
// sharded model saves it) into `optimizer` over `params`, just loaded from its optimizer_state: a
// copy of each whole on `device`. InputError naming `path` for a tensor of the wrong size.
void restore_optimizer_tensors(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::Tensor>& params, const StateDict& tensors,
                               const std::string& path, const c10::Device& device);

// The optimizer state rank `rank` loads: its --zero shard (`zero`), or the whole state
// (InputError when the checkpoint and the run disagree on --zero).
const at::Tensor& zero_state_of(const Checkpoint& checkpoint, const std::string& path, bool zero,
                                int rank);

// --zero from a checkpoint of another world size: `zero`'s shard of the state (rank `rank`'s),
// taken from the saved shards of the ranks that owned its parameters (`params`, in order), each
// read into an optimizer `make_optimizer` builds.
// Returns the saved world size.
int load_resharded_zero_state(const Checkpoint& checkpoint, const std::string& path,
                              const OptimizerFactory& make_optimizer, ZeroRedundancyOptimizer& zero,
                              const std::vector<torch::Tensor>& params, int rank,
                              const c10::Device& device);

// FNV-1a, 64 bits: a digest of bytes that is the same in every process (std::hash need not be).
class Digest {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) value_ = (value_ ^ bytes[i]) * 0x100000001b3ULL;
  }
  void add(const at::Tensor& t);
  template <typename T>
  void add_value(T v) {
    add(&v, sizeof v);
  }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0xcbf29ce484222325ULL;
};

// The per-parameter state of the optimizers make_optimizer() builds, in parameter order (Error for
// another optimizer).
void add_optimizer_state(Digest& d, const torch::optim::Optimizer& optimizer,
                         const std::vector<torch::Tensor>& parameters);

}  // namespace ddp::train
