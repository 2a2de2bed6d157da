#include "ddp/train/checkpoint.h"

#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "ddp/common/error.h"
#include "ddp/train/pt_file.h"

namespace ddp::train {
namespace {

constexpr const char* kFormat = "ddp.checkpoint";
constexpr int64_t kVersion = 1;

// Reads the entries of a checkpoint dict, naming the file and the key in every complaint.
class Entries {
 public:
  Entries(c10::impl::GenericDict dict, std::string origin)
      : dict_(std::move(dict)), origin_(std::move(origin)) {}

  const c10::IValue& get(const std::string& key) const {
    auto it = dict_.find(c10::IValue(key));
    if (it == dict_.end()) {
      throw InputError(
          fmt::format("{}: not a complete checkpoint: key '{}' is missing", origin_, key));
    }
    return it->value();
  }
  bool has(const std::string& key) const { return dict_.find(c10::IValue(key)) != dict_.end(); }
  int64_t integer(const std::string& key) const { return checked(key, get(key).isInt()).toInt(); }
  std::string string(const std::string& key) const {
    return checked(key, get(key).isString()).toStringRef();
  }
  at::Tensor bytes(const std::string& key) const {
    const auto& v = get(key);
    return checked(key, v.isTensor() && v.toTensor().scalar_type() == at::kByte).toTensor();
  }
  at::Tensor ids(const std::string& key) const {  // a 1-D int64 tensor
    const auto& v = get(key);
    return checked(key, v.isTensor() && v.toTensor().scalar_type() == at::kLong &&
                            v.toTensor().dim() == 1)
        .toTensor();
  }
  std::vector<at::Tensor> byte_list(const std::string& key) const {
    return list(key, [](const at::Tensor& t) { return t.scalar_type() == at::kByte; });
  }
  std::vector<at::Tensor> floating_list(const std::string& key) const {  // 1-D
    return list(key, [](const at::Tensor& t) { return t.is_floating_point() && t.dim() == 1; });
  }

 private:
  // A list of tensors each of which is `ok`.
  std::vector<at::Tensor> list(const std::string& key, bool (*ok)(const at::Tensor&)) const {
    std::vector<at::Tensor> out;
    for (const auto& item : checked(key, get(key).isList()).toListRef()) {
      checked(key, item.isTensor() && ok(item.toTensor()));
      out.push_back(item.toTensor());
    }
    return out;
  }
  const c10::IValue& checked(const std::string& key, bool ok) const {
    if (!ok) {
      throw InputError(fmt::format("{}: checkpoint key '{}' holds a {} of the wrong kind", origin_,
                                   key, get(key).tagKind()));
    }
    return get(key);
  }
  c10::impl::GenericDict dict_;
  std::string origin_;
};

// The GradScaler's state_dict with its floats as 0-d float64 tensors, which the weights-only
// loaders read (grad_scaler_state_from takes either).
c10::IValue without_floats(const amp::GradScalerState& state) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& entry : amp::to_ivalue(state).toGenericDict()) {
    const c10::IValue& v = entry.value();
    out.insert(entry.key(),
               v.isDouble() ? c10::IValue(at::scalar_tensor(v.toDouble(), at::kDouble)) : v);
  }
  return out;
}

std::map<std::string, std::string> yaml_lines(const std::string& yaml) {
  std::map<std::string, std::string> out;
  std::istringstream in(yaml);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(": ");
    if (colon != std::string::npos) out[line.substr(0, colon)] = line.substr(colon + 2);
  }
  return out;
}

// The optimizer's entries: its state, and those of --fsdp, --zero and --sync.
void read_optimizer_entries(const Entries& e, Checkpoint& c, const std::string& origin) {
  c.optimizer_state = e.bytes("optimizer_state");
  if (e.has("optimizer_tensors")) {
    c.optimizer_tensors =
        state_dict_from(e.get("optimizer_tensors"), origin + ": 'optimizer_tensors'");
  }
  if (e.has("optimizer_shards")) c.optimizer_shards = e.byte_list("optimizer_shards");
  if (e.has("inner_optimizers")) {
    c.inner_optimizers = e.byte_list("inner_optimizers");
    c.outer_momentum = state_dict_from(e.get("outer_momentum"), origin + ": 'outer_momentum'");
  }
}

}  // namespace

c10::IValue to_ivalue(const Checkpoint& c) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kFormat));
  dict.insert("version", kVersion);
  dict.insert("epoch", c.epoch);
  dict.insert("step", c.step);
  if (c.epoch_step != 0) dict.insert("epoch_step", c.epoch_step);
  if (c.epoch_samples.defined()) dict.insert("epoch_samples", c.epoch_samples.cpu());
  dict.insert("world_size", c.world_size);
  dict.insert("batch_size", c.batch_size);
  dict.insert("seed", c.seed);
  dict.insert("optimizer", c.optimizer);
  dict.insert("config", c.config);
  dict.insert("model", to_ivalue(c.model));
  dict.insert("optimizer_state", c.optimizer_state.cpu());
  if (!c.optimizer_tensors.empty())
    dict.insert("optimizer_tensors", to_ivalue(c.optimizer_tensors));
  if (!c.optimizer_shards.empty()) {
    // A list of Any, not of Tensor: the latter pickles as build_tensorlist, which the
    // weights-only readers (ours and Python's) refuse.
    c10::impl::GenericList shards(c10::AnyType::get());
    for (const auto& shard : c.optimizer_shards) shards.push_back(shard.cpu());
    dict.insert("optimizer_shards", shards);
  }
  if (!c.inner_optimizers.empty()) {
    c10::impl::GenericList inner(c10::AnyType::get());  // as optimizer_shards
    for (const auto& state : c.inner_optimizers) inner.push_back(state.cpu());
    dict.insert("inner_optimizers", inner);
    dict.insert("outer_momentum", to_ivalue(c.outer_momentum));
  }
  if (c.bucket_cap_bytes > 0) dict.insert("bucket_cap_bytes", c.bucket_cap_bytes);
  dict.insert("rng_state", c.rng_state.cpu());
  if (c.grad_scaler) dict.insert("grad_scaler", without_floats(*c.grad_scaler));
  if (c.shard_rank >= 0) {
    dict.insert("shard_rank", c.shard_rank);
    c10::impl::GenericList shards(c10::AnyType::get());  // as optimizer_shards
    for (const auto& shard : c.parameter_shards) shards.push_back(shard.cpu());
    dict.insert("parameter_shards", shards);
  }
  return dict;
}

Checkpoint checkpoint_from(const c10::IValue& contents, const std::string& origin) {
  if (!contents.isGenericDict()) {
    throw InputError(fmt::format("{}: not a checkpoint (found a {})", origin, contents.tagKind()));
  }
  const Entries e(contents.toGenericDict(), origin);
  if (e.string("format") != kFormat) {
    throw InputError(
        fmt::format("{}: not a ddp checkpoint (format '{}')", origin, e.string("format")));
  }
  if (e.integer("version") != kVersion) {
    throw InputError(fmt::format("{}: checkpoint version {}; this build reads version {}", origin,
                                 e.integer("version"), kVersion));
  }
  Checkpoint c;
  c.epoch = e.integer("epoch");
  c.step = e.integer("step");
  if (e.has("epoch_step")) c.epoch_step = e.integer("epoch_step");
  if (e.has("epoch_samples")) c.epoch_samples = e.ids("epoch_samples");
  c.world_size = e.integer("world_size");
  c.batch_size = e.integer("batch_size");
  c.seed = e.integer("seed");
  c.optimizer = e.string("optimizer");
  c.config = e.string("config");
  c.model = state_dict_from(e.get("model"), origin);
  read_optimizer_entries(e, c, origin);
  if (e.has("bucket_cap_bytes")) c.bucket_cap_bytes = e.integer("bucket_cap_bytes");
  c.rng_state = e.bytes("rng_state");
  if (e.has("grad_scaler")) {
    c.grad_scaler = amp::grad_scaler_state_from(e.get("grad_scaler"), origin + ": 'grad_scaler'");
  }
  if (e.has("shard_rank")) {
    c.shard_rank = e.integer("shard_rank");
    c.parameter_shards = e.floating_list("parameter_shards");
  }
  if (c.epoch < 0 || c.step < 0 || c.epoch_step < 0 || c.world_size < 1 || c.batch_size < 0 ||
      c.rng_state.dim() != 2 || c.rng_state.size(0) != c.world_size) {
    throw InputError(
        fmt::format("{}: checkpoint with inconsistent values (epoch {}, step {}, "
                    "world size {}, batch size {})",
                    origin, c.epoch, c.step, c.world_size, c.batch_size));
  }
  return c;
}

Checkpoint read_checkpoint(const std::string& path) {
  return checkpoint_from(read_pt_file(path), path);
}

std::string checkpoint_file_name(CheckpointPosition p, bool sharded) {
  const char* tail = sharded ? ".shards" : ".pt";
  if (p.epoch_step == 0) return fmt::format("checkpoint-epoch-{:04d}{}", p.epoch, tail);
  return fmt::format("checkpoint-epoch-{:04d}-step-{:06d}{}", p.epoch, p.epoch_step, tail);
}

std::string shard_file_name(int64_t rank, int64_t world_size) {
  return fmt::format("rank-{:05d}-of-{:05d}.pt", rank, world_size);
}

std::optional<CheckpointPosition> checkpoint_file_position(const std::string& file_name) {
  const bool sharded = file_name.size() > 7 && file_name.substr(file_name.size() - 7) == ".shards";
  const std::string name = sharded ? file_name.substr(0, file_name.size() - 7) + ".pt" : file_name;
  const std::string head = "checkpoint-epoch-", mid = "-step-", tail = ".pt";
  if (name.size() <= head.size() + tail.size() || name.rfind(head, 0) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
    return std::nullopt;
  }
  std::string body = name.substr(head.size(), name.size() - head.size() - tail.size());
  std::string step_digits;
  if (const size_t at = body.find(mid); at != std::string::npos) {
    step_digits = body.substr(at + mid.size());
    body.resize(at);
    if (step_digits.empty()) return std::nullopt;
  }
  auto number = [](const std::string& digits) -> std::optional<int64_t> {
    if (digits.empty() || digits.size() > 15 ||
        !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
      return std::nullopt;
    }
    return std::stoll(digits);
  };
  const auto epoch = number(body);
  const auto step = step_digits.empty() ? std::optional<int64_t>(0) : number(step_digits);
  if (!epoch || !step) return std::nullopt;
  return CheckpointPosition{*epoch, *step};
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<CheckpointPosition, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (auto position = checkpoint_file_position(entry.path().filename().string())) {
      found.emplace_back(*position, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return b.first < a.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::vector<Checkpoint> read_sharded_checkpoint(const std::string& dir) {
  // The world size is in every file's name; rank 0's says which to expect.
  int64_t world = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string head = "rank-00000-of-", digits = name.substr(std::min(name.size(), 14ul), 5);
    if (name.size() == 22 && name.rfind(head, 0) == 0 && name.substr(19) == ".pt" &&
        std::all_of(digits.begin(), digits.end(), ::isdigit)) {
      world = std::max<int64_t>(world, std::stoll(digits));
    }
  }
  if (ec) throw InputError(fmt::format("{}: cannot list the directory: {}", dir, ec.message()));
  if (world == 0) {
    throw InputError(
        fmt::format("{}: an incomplete sharded checkpoint: rank 0's file is missing", dir));
  }
  std::vector<Checkpoint> files;
  for (int64_t rank = 0; rank < world; ++rank) {
    const std::string path = (std::filesystem::path(dir) / shard_file_name(rank, world)).string();
    if (!std::filesystem::exists(path)) {
      throw InputError(fmt::format(
          "{}: an incomplete sharded checkpoint: {} is missing (its rank stopped while writing)",
          dir, shard_file_name(rank, world)));
    }
    files.push_back(read_checkpoint(path));
    const Checkpoint& c = files.back();
    if (c.shard_rank != rank || c.world_size != world || c.epoch != files[0].epoch ||
        c.epoch_step != files[0].epoch_step ||
        c.parameter_shards.size() != files[0].parameter_shards.size()) {
      throw InputError(fmt::format(
          "{}: not the file of rank {} of {} of this checkpoint (rank {} of {}, epoch {} step {})",
          path, rank, world, c.shard_rank, c.world_size, c.epoch, c.epoch_step));
    }
  }
  return files;
}

std::vector<std::string> stale_checkpoints(const std::vector<std::string>& newest_first,
                                           int64_t keep_last) {
  const size_t keep = static_cast<size_t>(std::max<int64_t>(keep_last, 0));
  if (newest_first.size() <= keep) return {};
  return {newest_first.begin() + static_cast<std::ptrdiff_t>(keep), newest_first.end()};
}

void remove_stale_checkpoints(const std::string& dir, int64_t keep_last) {
  for (const auto& old : stale_checkpoints(list_checkpoints(dir), keep_last)) {
    std::error_code ec;
    std::filesystem::remove_all(old, ec);  // a sharded checkpoint is a directory
  }
}

std::optional<int64_t> batch_size_for_world(int64_t batch, int64_t saved_world, int64_t world) {
  const int64_t global = batch * saved_world;
  if (world < 1 || global % world != 0) return std::nullopt;
  return global / world;
}

std::vector<std::string> changed_settings(const std::string& saved_yaml,
                                          const std::string& current_yaml,
                                          const std::vector<std::string>& ignored) {
  const auto saved = yaml_lines(saved_yaml), current = yaml_lines(current_yaml);
  std::vector<std::string> out;
  for (const auto& [key, value] : current) {
    if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) continue;
    auto it = saved.find(key);
    const std::string old = it == saved.end() ? "(unset)" : it->second;
    if (old != value) out.push_back(fmt::format("{}: {} -> {}", key, old, value));
  }
  return out;
}

}  // namespace ddp::train
