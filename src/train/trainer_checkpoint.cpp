// The trainer's checkpoints: saving (rank 0 writes) and resuming (every rank reads).
//
// Note [No collective in a rank-0 branch]
// A collective that rank 0 alone enters waits for the others until the timeout. So saving and
// resuming are called on every rank; the collectives they contain (gathering the RNG states,
// agreeing on success, on the checkpoint's epoch) run on every rank, and only the file writes are
// inside `if (is_main())`. A failure on one rank is turned into an error on all of them by
// agree_all_ok(), instead of leaving the others blocked in the next collective.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "cpu_rng.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/trainer.h"
#include "torch_compat.h"
#include "torch_errors.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;

// Settings a resumed run may change without a warning: they do not change the training math.
const std::vector<std::string> kFreeOnResume = {"epochs",
                                                "resume",
                                                "output-dir",
                                                "log-level",
                                                "eval-every",
                                                "save-every",
                                                "keep-last",
                                                "save-prefix",
                                                "init-weights",
                                                "threads",
                                                "comm-timeout",
                                                "rendezvous-timeout",
                                                "backend",
                                                "device",
                                                "batch-size",
                                                "stall-warning",
                                                "check-params-every",
                                                "checkpoint-on-signal",
                                                "record-samples"};

// All ranks learn whether every rank succeeded: each rank that failed rethrows its own error,
// the others throw an Error naming what failed elsewhere. A collective.
void agree_all_ok(const Distributed& dist, const std::exception_ptr& error,
                  const std::string& what) {
  const bool failed = comm::any_rank(*dist.group, error != nullptr, dist.device);
  if (error) std::rethrow_exception(error);
  if (failed) {
    throw Error(fmt::format("{} failed on another rank; its log says why", what));
  }
}

// The ranks' RNG states (uint8, `bytes` each) as the checkpoint's [rank, byte] tensor.
at::Tensor rng_rows(const std::vector<std::string>& states, int64_t bytes) {
  auto rows = torch::empty({static_cast<int64_t>(states.size()), bytes}, torch::kByte);
  for (size_t r = 0; r < states.size(); ++r) {
    std::memcpy(rows[static_cast<int64_t>(r)].data_ptr(), states[r].data(), states[r].size());
  }
  return rows;
}

at::Tensor byte_tensor(const std::string& bytes) {
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())},
                          torch::kByte)
      .clone();
}

std::string serialized(const torch::optim::Optimizer& optimizer) {
  std::ostringstream out;
  torch::save(optimizer, out);
  return out.str();
}

// FNV-1a, 64 bits: a digest of bytes that is the same in every process (std::hash need not be).
class Digest {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) value_ = (value_ ^ bytes[i]) * 0x100000001b3ULL;
  }
  void add(const at::Tensor& t) {
    if (!t.defined()) return add("-", 1);
    const at::Tensor c = t.detach().cpu().contiguous();
    add(c.data_ptr(), c.nbytes());
  }
  template <typename T>
  void add_value(T v) {
    add(&v, sizeof v);
  }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0xcbf29ce484222325ULL;
};

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

// The per-parameter state of the optimizers make_optimizer() builds, in parameter order.
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

}  // namespace

uint64_t Trainer::state_digest() {
  Digest d;
  for (const auto& p : workload_.module->parameters()) d.add(p);
  for (const auto& b : workload_.module->buffers()) d.add(b);
  add_optimizer_state(d, optimizer(), workload_.module->parameters());
  if (scaler_) {
    const amp::GradScalerState& s = scaler_->state();
    d.add_value(s.scale);
    d.add_value(s.growth_tracker);
  }
  d.add(cpu_rng_state());
  d.add_value(step_);
  return d.value();
}

Checkpoint Trainer::checkpoint_here(CheckpointPosition at, const torch::Tensor& untrained) const {
  Checkpoint c;
  c.epoch = at.epoch;
  c.epoch_step = at.epoch_step;
  c.epoch_samples = untrained;
  c.step = step_;
  c.world_size = dist_.world_size();
  c.batch_size = batch_size_;
  c.seed = config_.seed;
  c.optimizer = to_string(config_.optimizer);
  c.config = to_yaml(config_);
  c.model = state_dict(*workload_.module, kModulePrefix);
  c.bucket_cap_bytes = tuned_bucket_cap_bytes_;
  return c;
}

void Trainer::save_checkpoint(CheckpointPosition at, const torch::Tensor& untrained) {
  const std::string what = at.epoch_step == 0
                               ? fmt::format("after epoch {}", at.epoch)
                               : fmt::format("{} steps into epoch {}", at.epoch_step, at.epoch + 1);
  // Every rank's RNG state, for rank 0 to write: a collective, so all ranks are here.
  const at::Tensor rng = cpu_rng_state().contiguous();
  const std::string rng_bytes(static_cast<const char*>(rng.data_ptr()), rng.nbytes());
  const std::vector<std::string> all_rng =
      comm::all_gather_bytes(*dist_.group, rng_bytes, dist_.device, rng_bytes.size());
  // --zero: every rank's shard of the optimizer state, for rank 0 to write; --sync local-sgd or
  // diloco: every rank's inner optimizer.
  const bool per_rank = zero_ || diloco_;
  const std::string opt = per_rank || dist_.is_main() ? serialized(optimizer()) : std::string();
  const std::vector<std::string> shards =
      per_rank ? comm::all_gather_bytes(*dist_.group, opt, dist_.device)
               : std::vector<std::string>();

  std::exception_ptr error;
  std::string numbered;  // rank 0's file
  if (dist_.is_main()) {
    try {
      Checkpoint c = checkpoint_here(at, untrained);
      c.optimizer_state = zero_ ? torch::empty({0}, torch::kByte) : byte_tensor(opt);
      auto& per_rank_states = zero_ ? c.optimizer_shards : c.inner_optimizers;
      for (const auto& shard : shards) per_rank_states.push_back(byte_tensor(shard));
      if (diloco_) {
        for (size_t i = 0; i < diloco_->momentum().size(); ++i) {
          c.outer_momentum.emplace_back(std::to_string(i), diloco_->momentum()[i].cpu());
        }
      }
      c.rng_state = rng_rows(all_rng, rng.numel());
      if (scaler_) c.grad_scaler = scaler_->state();

      // The numbered file first, then the names that point at the newest: a kill at any moment
      // leaves every name holding a complete file.
      const fs::path dir(config_.output_dir);
      numbered = (dir / checkpoint_file_name(at)).string();
      write_pt_file(numbered, to_ivalue(c));
      link_atomically(numbered, (dir / "checkpoint.pt").string());
      save_weights(*workload_.module, (dir / "model.pt").string(),
                   config_.save_prefix == SavePrefix::kNone ? "" : kModulePrefix);
      for (const auto& old : stale_checkpoints(list_checkpoints(dir.string()), config_.keep_last)) {
        std::error_code ec;
        fs::remove(old, ec);
      }
      log::info("checkpoint {}: {}", what, numbered);
    } catch (const std::exception& e) {
      log::error("saving the checkpoint {} failed: {}", what, first_line_of(e));
      error = std::current_exception();
    }
  }
  // The barrier after every save, carrying rank 0's outcome.
  agree_all_ok(dist_, error, "saving the checkpoint");
  elastic_->checkpoint_saved(fmt::format("{} ({})", numbered, what));
}

bool Trainer::resume() {
  // Which file: the one named, or the newest that reads as a checkpoint.
  std::optional<Checkpoint> checkpoint;
  std::string path;
  std::exception_ptr error;
  try {
    if (config_.resume != "auto") {
      path = config_.resume;
      checkpoint = read_checkpoint(path);
    } else {
      std::vector<std::string> candidates = list_checkpoints(config_.output_dir);
      const std::string latest = (fs::path(config_.output_dir) / "checkpoint.pt").string();
      if (candidates.empty() && fs::exists(latest)) candidates.push_back(latest);
      for (const auto& candidate : candidates) {
        try {
          checkpoint = read_checkpoint(candidate);
          path = candidate;
          break;
        } catch (const InputError& e) {
          if (dist_.is_main()) log::warn("--resume auto: skipping {}", e.what());
        }
      }
      if (!checkpoint && !candidates.empty()) {
        throw InputError(
            fmt::format("--resume auto: none of the {} checkpoint(s) in '{}' can be "
                        "read (see the warnings above)",
                        candidates.size(), config_.output_dir));
      }
    }
    if (checkpoint) apply(*checkpoint, path);
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  agree_all_ok(dist_, error, "resuming from the checkpoint");

  // Every rank must continue from the same epoch (a node with another copy of the output dir
  // would silently train a different model).
  const int64_t epoch = checkpoint ? checkpoint->epoch : -1;
  const int64_t epoch_step = checkpoint ? checkpoint->epoch_step : -1;
  auto range =
      torch::tensor({epoch, -epoch, epoch_step, -epoch_step}, torch::TensorOptions(torch::kLong))
          .to(dist_.device);
  dist_.group->all_reduce(range, comm::ReduceOp::kMax)->wait();
  range = range.cpu();
  if (range[0].item<int64_t>() != -range[1].item<int64_t>() ||
      range[2].item<int64_t>() != -range[3].item<int64_t>()) {
    throw InputError(fmt::format(
        "the ranks found different checkpoints (epochs {} to {}): every rank must see the same "
        "output dir '{}'",
        -range[1].item<int64_t>(), range[0].item<int64_t>(), config_.output_dir));
  }
  if (!checkpoint) {
    log::info("--resume auto: no checkpoint in '{}' yet, starting from scratch",
              config_.output_dir);
  }
  return checkpoint.has_value();
}

const at::Tensor& Trainer::zero_state_of(const Checkpoint& c, const std::string& path) const {
  const bool sharded = !c.optimizer_shards.empty();
  if (sharded != config_.zero) {
    throw InputError(fmt::format("{}: saved {} --zero; resume {} it", path,
                                 sharded ? "with" : "without", sharded ? "with" : "without"));
  }
  if (!sharded) return c.optimizer_state;
  return c.optimizer_shards[static_cast<size_t>(dist_.rank())];
}

void Trainer::load_resharded_zero_state(const Checkpoint& c, const std::string& path) {
  // Each saved shard into an optimizer over the parameters its rank owned (PyTorch's partition
  // for the saved world), then this rank's parameters' state moved out of them. Element-wise
  // optimizers (SGD, Adam, AdamW) keep state per parameter only, so the new shards hold exactly
  // what the old ones did.
  const std::vector<torch::Tensor> params = workload_.module->parameters();
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  const int saved_world = static_cast<int>(c.optimizer_shards.size());
  const std::vector<int> owners = partition_parameters(numels, saved_world);
  torch::optim::Optimizer& local = zero_->local();
  for (int q = 0; q < saved_world; ++q) {
    std::vector<torch::Tensor> owned;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owners[i] == q) owned.push_back(params[i]);
    }
    const auto saved = make_optimizer(config_, owned);
    load_optimizer(*saved, c.optimizer_shards[static_cast<size_t>(q)], path);
    for (size_t i = 0; i < params.size(); ++i) {
      if (owners[i] != q || zero_->owners()[i] != dist_.rank()) continue;
      auto state = saved->state().find(compat::optimizer_state_key(*saved, params[i]));
      if (state == saved->state().end()) continue;  // not stepped yet: no state
      local.state()[compat::optimizer_state_key(local, params[i])] = std::move(state->second);
    }
  }
  if (dist_.is_main()) {
    log::info("{}: the optimizer state of {} ranks' shards resharded over {} ranks", path,
              saved_world, dist_.world_size());
  }
}

void Trainer::load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& state,
                             const std::string& path) const {
  try {
    std::istringstream in(std::string(static_cast<const char*>(state.data_ptr()),
                                      static_cast<size_t>(state.numel())));
    torch::load(optimizer, in, dist_.device);
  } catch (const c10::Error& e) {
    throw InputError(
        fmt::format("{}: the optimizer state cannot be loaded: {}", path, first_line_of(e)));
  }
}

void Trainer::apply(const Checkpoint& c, const std::string& path) {
  check_resumable(c, path);  // may change the batch size per rank
  load_state_dict(*workload_.module, c.model, path);
  load_training_state(c, path);
  step_ = c.step;
  start_epoch_ = c.epoch;
  start_epoch_step_ = c.epoch_step;
  start_epoch_samples_ = c.epoch_step == 0 ? torch::Tensor() : untrained_samples_of(c, path);
  log::info(
      "resumed from {}: epoch {}, step {}{}", path, c.epoch, c.step,
      c.epoch_step == 0 ? "" : fmt::format(" ({} steps into epoch {})", c.epoch_step, c.epoch + 1));
}

torch::Tensor Trainer::untrained_samples_of(const Checkpoint& c, const std::string& path) const {
  const int64_t size = workload_.train_set.size();
  if (!c.epoch_samples.defined()) {
    // Written before checkpoints held the ids: its world took the sampler's sequence in strides.
    const torch::Tensor sequence = epoch_sequence(c.epoch, c.world_size);
    const int64_t trained = data::trained_prefix(
        sequence.size(0), c.world_size, c.epoch_step * c.batch_size * config_.grad_accum_steps);
    return sequence.narrow(0, trained, sequence.size(0) - trained);
  }
  const torch::Tensor& ids = c.epoch_samples;
  if (ids.numel() > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= size)) {
    throw InputError(fmt::format(
        "{}: 'epoch_samples' holds sample ids from {} to {}, outside the {} training samples of "
        "this run's data",
        path, ids.min().item<int64_t>(), ids.max().item<int64_t>(), size));
  }
  if (c.world_size != dist_.world_size() && dist_.is_main()) {
    log::info("{}: epoch {}'s {} untrained samples are shared by {} ranks, not {}", path,
              c.epoch + 1, ids.numel(), dist_.world_size(), c.world_size);
  }
  return ids;
}

void Trainer::check_resumable(const Checkpoint& c, const std::string& path) {
  if (c.optimizer != to_string(config_.optimizer)) {
    throw InputError(fmt::format("{}: saved with optimizer '{}', but the run uses '{}'", path,
                                 c.optimizer, to_string(config_.optimizer)));
  }
  const int64_t world = dist_.world_size();
  if (c.world_size != world) {
    const auto batch = batch_size_for_world(c.batch_size, c.world_size, world);
    if (!batch) {
      throw InputError(fmt::format(
          "{}: saved by {} ranks with batch size {} (global batch {}), which {} ranks cannot "
          "share evenly; resume on a world size that divides {}",
          path, c.world_size, c.batch_size, c.batch_size * c.world_size, world,
          c.batch_size * c.world_size));
    }
    if (dist_.is_main()) {
      log::warn(
          "{}: saved by {} ranks, resumed on {}: batch size per rank {} -> {} keeps the "
          "global batch {}",
          path, c.world_size, world, c.batch_size, *batch, c.batch_size * c.world_size);
    }
    batch_size_ = *batch;
  }
  if (dist_.is_main()) {
    for (const auto& change : changed_settings(c.config, to_yaml(config_), kFreeOnResume)) {
      log::warn("{}: resuming with a changed setting, {}", path, change);
    }
  }
}

void Trainer::load_training_state(const Checkpoint& c, const std::string& path) {
  tuned_bucket_cap_bytes_ = c.bucket_cap_bytes;
  if (zero_ && static_cast<int64_t>(c.optimizer_shards.size()) != dist_.world_size() &&
      !c.optimizer_shards.empty()) {
    load_resharded_zero_state(c, path);
  } else if (diloco_) {
    load_sync_state(c, path);
  } else {
    load_optimizer(optimizer(), zero_state_of(c, path), path);
  }
  if (scaler_ && c.grad_scaler) {
    scaler_->load_state(*c.grad_scaler);
  } else if (scaler_ && dist_.is_main()) {
    log::warn("{}: saved without --amp fp16: the GradScaler starts from scale {}", path,
              scaler_->get_scale());
  }
  // Each rank continues its own random stream; a rank the checkpoint did not have takes rank 0's.
  const int64_t row = dist_.rank() < c.world_size ? dist_.rank() : 0;
  try {
    set_cpu_rng_state(c.rng_state[row].contiguous());
  } catch (const c10::Error& e) {
    throw InputError(
        fmt::format("{}: the RNG state cannot be restored: {}", path, first_line_of(e)));
  }
}

// --sync local-sgd, diloco: this rank's own inner optimizer, and the outer momentum; the model
// just loaded becomes the global parameters. From a checkpoint of a run without --sync, every
// rank's inner optimizer starts from its optimizer state and the momentum from nothing.
void Trainer::load_sync_state(const Checkpoint& c, const std::string& path) {
  if (c.inner_optimizers.empty()) {
    load_optimizer(optimizer(), c.optimizer_state, path);
    diloco_->restart({});
    return;
  }
  if (static_cast<int>(c.inner_optimizers.size()) != dist_.world_size()) {
    throw InputError(
        fmt::format("{}: saved by {} ranks with --sync {}, each with an optimizer of "
                    "its own; resume it on {} ranks",
                    path, c.inner_optimizers.size(), config_.sync, c.inner_optimizers.size()));
  }
  load_optimizer(optimizer(), c.inner_optimizers[static_cast<size_t>(dist_.rank())], path);
  std::vector<at::Tensor> momentum;
  for (const auto& [index, tensor] : c.outer_momentum) momentum.push_back(tensor.to(dist_.device));
  diloco_->restart(std::move(momentum));
}

Checkpoint Trainer::state_at(const ElasticPosition& at, int world) {
  Checkpoint c = checkpoint_here({at.epoch, at.epoch_step}, at.rest());
  c.world_size = world;
  // The global batch is kept where the new world divides it; else each rank keeps its batch.
  c.batch_size = batch_size_for_world(batch_size_, batch_world_, world).value_or(batch_size_);
  c.optimizer_state = byte_tensor(serialized(optimizer()));
  const at::Tensor rng = cpu_rng_state().contiguous();
  c.rng_state = rng.unsqueeze(0).repeat({world, 1});  // every rank continues this stream
  if (scaler_) c.grad_scaler = scaler_->state();
  return c;
}

}  // namespace ddp::train
