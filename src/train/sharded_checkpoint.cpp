#include "ddp/train/sharded_checkpoint.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>
#include <utility>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/train/pt_file.h"
#include "optimizer_state.h"
#include "sharded_checkpoint_writer.h"

namespace ddp::train {

namespace fs = std::filesystem;

namespace {

// A checkpoint of the model and the optimizer only: no training position, and no RNG state (a
// row of none per rank, the shape the format asks for).
Checkpoint model_and_optimizer(int world_size) {
  Checkpoint c;
  c.world_size = world_size;
  c.rng_state = torch::empty({world_size, 0}, torch::kUInt8);
  return c;
}

// InputError unless `optimizer` steps exactly the model's shards (model.parameters()): its state
// is saved and loaded per shard, and an optimizer over named_parameters()'s per-parameter views
// would be saved without it.
void check_steps_the_shards(const torch::optim::Optimizer& optimizer,
                            FullyShardedDataParallel& model) {
  std::set<const void*> shards, stepped;
  for (const auto& shard : model.parameters()) shards.insert(shard.unsafeGetTensorImpl());
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) stepped.insert(param.unsafeGetTensorImpl());
  }
  if (stepped != shards) {
    throw InputError(
        "ShardedCheckpoint: the optimizer must step the model's shards, model.parameters(), and "
        "nothing else (an optimizer over named_parameters()'s per-parameter views is not "
        "checkpointed by it)");
  }
}

}  // namespace

struct ShardedCheckpoint::Writer {
  BackgroundWrite write;
};

ShardedCheckpoint::ShardedCheckpoint(FullyShardedDataParallel& model,
                                     torch::optim::Optimizer& optimizer, OptimizerFactory make,
                                     std::shared_ptr<comm::ProcessGroup> group)
    : state_(model, group),
      optimizer_(optimizer),
      make_(std::move(make)),
      group_(std::move(group)),
      device_(model.parameters().empty() ? c10::Device(c10::kCPU)
                                         : model.parameters().front().device()),
      writer_(std::make_unique<Writer>()) {
  check_steps_the_shards(optimizer_, model);
}

ShardedCheckpoint::~ShardedCheckpoint() = default;  // BackgroundWrite's joins the thread

void ShardedCheckpoint::agree(std::exception_ptr error, const std::string& what) {
  const bool failed = comm::any_rank(*group_, error != nullptr, device_);
  if (error) std::rethrow_exception(error);
  if (failed) throw Error(fmt::format("{} failed on another rank", what));
}

void ShardedCheckpoint::save_async(const std::string& dir) {
  start_save(dir, /*background=*/true);
}

void ShardedCheckpoint::save(const std::string& dir) {
  start_save(dir, /*background=*/false);
  wait();
}

void ShardedCheckpoint::start_save(const std::string& dir, bool background) {
  wait();
  Checkpoint c = model_and_optimizer(group_->world_size());
  state_.fill_rank_file(c, optimizer_, make_, /*copy=*/background);
  writer_->write.start(
      std::move(c),
      (fs::path(dir) / shard_file_name(group_->rank(), group_->world_size())).string(), background);
  writing_ = dir;
}

void ShardedCheckpoint::wait() {
  if (writing_.empty()) return;
  std::exception_ptr error;
  try {
    writer_->write.wait();
  } catch (...) {
    error = std::current_exception();
  }
  agree(error, "writing the sharded checkpoint " + std::exchange(writing_, ""));
}

void ShardedCheckpoint::save_gathered(const std::string& path) {
  const bool writing = group_->rank() == 0;
  StreamedFiles files;
  ShardedState::Deferred state;  // rank 0's
  PtFileWriter* file = nullptr;
  if (writing) {
    try {
      state = state_.deferred_state(kModulePrefix, &optimizer_, make_);
      Checkpoint c = model_and_optimizer(group_->world_size());
      c.model = state.model;
      c.optimizer_state = byte_tensor(std::move(state.optimizer_state));
      c.optimizer_tensors = state.optimizer_tensors;
      file = &files.open(path, to_ivalue(c));
    } catch (...) {
      files.error = std::current_exception();
    }
  }
  state_.write_gathered(state, &optimizer_, files.writer(writing));  // every rank takes part
  if (writing && !files.error) {
    try {
      file->commit();
    } catch (...) {
      files.error = std::current_exception();
    }
  }
  agree(files.error, "saving " + path);
}

void ShardedCheckpoint::load(const std::string& path) {
  std::exception_ptr error;
  try {
    read_into_this_rank(path);
  } catch (...) {
    error = std::current_exception();
  }
  agree(error, "loading " + path);
}

void ShardedCheckpoint::read_into_this_rank(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    state_.load_shards(read_sharded_checkpoint(path), optimizer_, make_, path);
    return;
  }
  const Checkpoint c = read_checkpoint(path);  // mapped: only this rank's parts are read
  if (c.shard_rank >= 0) {
    throw InputError(
        fmt::format("{}: one rank's file of a sharded checkpoint; load its directory", path));
  }
  state_.load_state_dict(c.model, path);
  state_.load_unsharded_optimizer_state(optimizer_, c.optimizer_state, c.optimizer_tensors, make_,
                                        path);
}

}  // namespace ddp::train
