#pragma once
// --checkpoint-sharded: each rank writes its own file of a checkpoint (checkpoint.h's
// shard_rank) on a thread of its own, as PyTorch DCP's async_save: training waits only for the
// copy of the rank's state, the write goes on beside the next steps. A private header of the
// train layer, used by TrainState.
//
// Note [A sharded checkpoint is whole or absent]
// Each file appears whole or not at all (written aside, then renamed: write_pt_file), so a
// checkpoint's directory is complete exactly when it holds every rank's file, which is what
// read_sharded_checkpoint checks and --resume auto relies on. Nothing older is deleted until every
// rank has finished the newer one (settle(), at the next save or at the end), so a rank killed
// while it writes leaves the newest complete checkpoint as it was.

#include <exception>
#include <string>
#include <thread>

#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"

namespace ddp::train {

// One file written on a thread of its own.
class BackgroundWrite {
 public:
  BackgroundWrite() = default;
  ~BackgroundWrite();  // waits for the write in flight; its error, if any, is dropped
  BackgroundWrite(const BackgroundWrite&) = delete;
  BackgroundWrite& operator=(const BackgroundWrite&) = delete;

  // Starts writing `checkpoint` to `path`, after the previous write (whose error it throws): on
  // a thread of its own, or (`background` false) here, before returning. wait() rethrows the
  // write's error either way.
  void start(Checkpoint checkpoint, std::string path, bool background = true);
  // Waits for the write in flight, if any; rethrows its error.
  void wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

class ShardedCheckpointWriter {
 public:
  // Into config.output_dir, keeping config.keep_last checkpoints; `dist` outlives the writer.
  ShardedCheckpointWriter(const Config& config, const Distributed& dist);

  // Every rank, collectives: settle(), then the directory of the checkpoint at `at` made anew
  // (rank 0 deletes what a run that stopped while writing it left). Returns the directory.
  std::string begin(CheckpointPosition at);
  // Writes this rank's file of the checkpoint begin() made: on a thread (`background`;
  // `checkpoint` a copy, which the thread owns) or here, before returning.
  void write(Checkpoint checkpoint, bool background);
  // Every rank, a collective: waits for this rank's write, agrees that every rank's succeeded
  // (an error on every rank otherwise), then rank 0 deletes the checkpoints beyond keep_last.
  void settle();

 private:
  const Config& config_;
  const Distributed& dist_;
  BackgroundWrite write_;
  std::string dir_;  // of the checkpoint being written ("": none)
};

}  // namespace ddp::train
