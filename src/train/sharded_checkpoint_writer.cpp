#include "sharded_checkpoint_writer.h"

#include <fmt/format.h>

#include <filesystem>
#include <utility>

#include "ddp/common/log.h"
#include "ddp/train/pt_file.h"
#include "torch_errors.h"

namespace ddp::train {

namespace fs = std::filesystem;

BackgroundWrite::~BackgroundWrite() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundWrite::start(Checkpoint checkpoint, std::string path, bool background) {
  wait();
  auto write = [this, c = std::move(checkpoint), path = std::move(path)] {
    try {
      fs::create_directories(fs::path(path).parent_path());  // each host's, where not shared
      write_pt_file(path, to_ivalue(c));
    } catch (...) {
      error_ = std::current_exception();
    }
  };
  if (!background) return write();
  thread_ = std::thread(std::move(write));  // which owns the copy; error_ is read after join()
}

void BackgroundWrite::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

ShardedCheckpointWriter::ShardedCheckpointWriter(const Config& config, const Distributed& dist)
    : config_(config), dist_(dist) {}

std::string ShardedCheckpointWriter::begin(CheckpointPosition at) {
  settle();
  const fs::path dir = fs::path(config_.output_dir) / checkpoint_file_name(at, /*sharded=*/true);
  std::exception_ptr error;
  if (dist_.is_main()) {
    try {
      fs::remove_all(dir);  // a run that stopped while writing it left some ranks' files
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  agree_all_ok(dist_, error, "clearing " + dir.string());  // no rank writes into it before
  dir_ = dir.string();
  return dir_;
}

void ShardedCheckpointWriter::write(Checkpoint checkpoint, bool background) {
  const int64_t rank = checkpoint.shard_rank;
  write_.start(std::move(checkpoint),
               (fs::path(dir_) / shard_file_name(rank, dist_.world_size())).string(), background);
}

void ShardedCheckpointWriter::settle() {
  if (dir_.empty()) return;
  std::exception_ptr error;
  try {
    write_.wait();
  } catch (const std::exception& e) {
    log::error("writing this rank's file of {} failed: {}", dir_, first_line_of(e));
    error = std::current_exception();
  }
  const std::string dir = std::exchange(dir_, "");
  agree_all_ok(dist_, error, "writing the sharded checkpoint " + dir);
  if (!dist_.is_main()) return;
  log::info("checkpoint {}: every rank's file written", dir);
  // Note [A sharded checkpoint is whole or absent]: only now may older ones go.
  remove_stale_checkpoints(config_.output_dir, config_.keep_last);
}

}  // namespace ddp::train
