#pragma once
// How a training checkpoint reaches the output directory, whichever mode fills it (a private
// header of the train layer): the numbered file, the names pointing at the newest, model.pt with
// --save-prefix's keys, the old ones past --keep-last deleted, and every rank agreeing on the
// outcome. See Note [No collective in a rank-0 branch] in train_state.h.

#include <ATen/core/ivalue.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "ddp/train/checkpoint.h"
#include "ddp/train/config.h"
#include "ddp/train/distributed.h"
#include "ddp/train/state_dict.h"

namespace ddp::train {

// "after epoch 2", "5 steps into epoch 3": where a checkpoint is, for the log.
std::string describe(CheckpointPosition at);

// <output-dir>/model.pt, and the prefix of its keys (--save-prefix).
std::string model_file_path(const Config& config);
std::string model_file_prefix(const Config& config);
// model.pt's contents: `model`'s weights (keys with `module.`) keyed as --save-prefix says.
c10::IValue model_file(const StateDict& model, const Config& config);

// The numbered file first (written by `write_numbered`), then the names that point at the newest:
// a kill at any moment leaves every name holding a complete file. Then model.pt, and the
// checkpoints past --keep-last go. Returns the numbered file. Rank 0's.
std::string write_checkpoint_files(CheckpointPosition at, const Config& config,
                                   const std::function<void(const std::string&)>& write_numbered,
                                   const std::function<void()>& write_model);

// Rank 0 writes the files as write_checkpoint_files() says, unless `error` holds a failure of
// its earlier work on them, and logs the outcome; then the barrier that carries it to every rank
// (every rank calls it). Returns "<file> (<where>)" (the file: "" but on rank 0).
std::string commit_checkpoint(const Config& config, const Distributed& dist, CheckpointPosition at,
                              std::exception_ptr error,
                              const std::function<void(const std::string&)>& write_numbered,
                              const std::function<void()>& write_model);

// A whole checkpoint (rank 0's `c`), by commit_checkpoint().
std::string write_whole_checkpoint(const Config& config, const Distributed& dist,
                                   const Checkpoint& c, CheckpointPosition at);

// InputError for one rank's file of a sharded checkpoint (`directory`: the whole directory) that
// a mode without shards, or without the directory, was asked to resume from.
[[noreturn]] void refuse_sharded_checkpoint(const std::string& path, bool directory);

}  // namespace ddp::train
