#include "fsdp_mode.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <tuple>
#include <utility>

#include "checkpoint_files.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "ddp/common/log.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/run_options.h"
#include "ddp/train/sharded_weights.h"
#include "shared_dir.h"
#include "torch_errors.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

FsdpMode::~FsdpMode() = default;

void FsdpMode::build(bool /*init_sync: rank 0's weights are always broadcast*/) {
  const Distributed& dist = run_.dist;
  if (run_.config.checkpoint_sharded) {  // fail now, not at the first save
    check_dir_shared(*dist.group, dist.device, run_.config.output_dir, "--checkpoint-sharded");
  }
  const Workload& w = run_.workload;
  FullyShardOptions options = fsdp_options(run_.config);
  std::shared_ptr<comm::ProcessGroup> shards;
  std::tie(shards, options.replicate_group()) = groups();
  model_ = std::make_unique<FullyShardedDataParallel>(w.module, w.units, shards, options);
  state_ = std::make_unique<ShardedState>(*model_, shards);
  optimizer_ = make_optimizer(run_.config, model_->parameters());
}

std::unique_ptr<Accumulation> FsdpMode::accumulate(bool last) {
  model_->set_requires_gradient_sync(last);
  return nullptr;
}

void FsdpMode::broadcast_buffers() {
  broadcast_coalesced(*run_.dist.group, run_.workload.module->buffers());  // one per dtype
}

torch::Tensor FsdpMode::forward(const torch::Tensor& input) {
  if (run_.config.ddp.broadcast_buffers() && torch::GradMode::is_enabled()) broadcast_buffers();
  return model_->forward_with(run_.workload.forward, input);
}

void FsdpMode::before_evaluation() {
  if (run_.config.ddp.broadcast_buffers()) broadcast_buffers();
}

int64_t FsdpMode::evaluation_forwards(int64_t batches) {
  return static_cast<int64_t>(comm::all_reduce_scalar(
      *run_.dist.group, static_cast<double>(batches), comm::ReduceOp::kMax, run_.dist.device));
}

int64_t FsdpMode::record_reduction(Timeline* timeline, int64_t step) {
  if (timeline == nullptr) return 0;
  const std::vector<fsdp::UnitTimes> units = model_->last_iteration();
  for (size_t u = 0; u < units.size(); ++u) {
    const fsdp::UnitTimes& t = units[u];
    const int lane = Timeline::kBucketLane + static_cast<int>(u);
    timeline->name_lane(lane, "unit " + t.name);
    const auto add = [&](const char* name, const char* category, fsdp::Clock::time_point begin,
                         fsdp::Clock::time_point end) {
      const fsdp::Clock::time_point none;
      if (begin != none && end != none) timeline->add(name, category, lane, begin, end, step);
    };
    add("all-gather", "comm", t.forward_gather, t.forward_begin);
    add("unit forward", "compute", t.forward_begin, t.forward_end);
    add("all-gather", "comm", t.backward_gather, t.backward_begin);
    add("unit backward", "compute", t.backward_begin, t.backward_end);
    add("reduce-scatter", "comm", t.backward_end, t.reduce_done);
  }
  return 0;
}

std::string FsdpMode::save(Checkpoint c, CheckpointPosition at) {
  if (run_.config.checkpoint_sharded) return save_sharded(std::move(c), at);
  return save_gathered(std::move(c), at);
}

// Streamed by rank 0 while the units are gathered one at a time (their parameters, then their
// optimizer state), so that no rank ever holds the whole model or the whole optimizer state.
std::string FsdpMode::save_gathered(Checkpoint c, CheckpointPosition at) {
  const Config& config = run_.config;
  const bool main = run_.dist.is_main();
  StreamedFiles files;
  ShardedState::Deferred state;  // rank 0's
  PtFileWriter* checkpoint = nullptr;
  PtFileWriter* model = nullptr;
  if (main) {
    try {
      state = state_->deferred_state(kModulePrefix, optimizer_.get(), optimizer_factory());
      c.model = state.model;
      c.optimizer_state = byte_tensor(std::move(state.optimizer_state));
      c.optimizer_tensors = state.optimizer_tensors;
      checkpoint = &files.open((fs::path(config.output_dir) / checkpoint_file_name(at)).string(),
                               to_ivalue(c));
      model = &files.open(model_file_path(config), model_file(state.model, config));
    } catch (...) {
      files.error = std::current_exception();
    }
  }
  state_->write_gathered(state, optimizer_.get(), files.writer(main));
  return commit_checkpoint(
      config, run_.dist, at, files.error, [&](const std::string&) { checkpoint->commit(); },
      [&] { model->commit(); });
}

std::string FsdpMode::save_sharded(Checkpoint c, CheckpointPosition at) {
  if (!writer_) writer_ = std::make_unique<ShardedCheckpointWriter>(run_.config, run_.dist);
  const std::string dir = writer_->begin(at);  // the previous one settled first
  const bool async = run_.config.checkpoint_async;
  state_->fill_rank_file(c, *optimizer_, optimizer_factory(), /*copy=*/async);
  writer_->write(std::move(c), async);
  if (async) {
    log::info("checkpoint {}: {} (each rank writing its file in the background)", describe(at),
              dir);
  } else {
    writer_->settle();  // every rank's file written, older checkpoints deleted
  }
  return fmt::format("{} ({})", dir, describe(at));
}

void FsdpMode::finish_saving() {
  if (!writer_) return;
  writer_->settle();
  std::exception_ptr error;
  try {  // written by rank 0 as the units are gathered: every rank takes part
    save_weights(*model_, model_file_path(run_.config), run_.dist.is_main(),
                 model_file_prefix(run_.config));
  } catch (...) {
    error = std::current_exception();
  }
  agree_all_ok(run_.dist, error, "saving model.pt");
}

void FsdpMode::load(const Checkpoint& c, const std::string& path,
                    const std::vector<Checkpoint>* shard_files) {
  if (shard_files != nullptr)
    return state_->load_shards(*shard_files, *optimizer_, optimizer_factory(), path);
  if (c.shard_rank >= 0) refuse_sharded_checkpoint(path, /*directory=*/false);
  state_->load_state_dict(c.model, path);  // this rank's shards of it
  // This rank's part of the per-parameter state.
  state_->load_unsharded_optimizer_state(*optimizer_, zero_state_of(c, path, false, 0),
                                         c.optimizer_tensors, optimizer_factory(), path);
}

}  // namespace ddp::train
