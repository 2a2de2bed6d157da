#pragma once
// A fully sharded model's (ddp/core/fully_shard.h) weights written to a file without any rank
// holding the whole model: the file is pickled first with placeholders where the parameters go
// (PtFileWriter), then the ranks gather one unit at a time and the writing rank writes each
// parameter as it arrives, the unit freed before the next.
//
//   ddp::train::save_weights(model, "model.pt", rank == 0);   // every rank calls it
//
// Python loads the file as save_weights' (nn.DataParallel's `module.` keys by default).

#include <torch/types.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/fully_shard.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"

namespace ddp::train {

// `model`'s state_dict() entries, keys prefixed with `prefix`: a placeholder
// (PtFileWriter::deferred) for each parameter (one under every name of a tied weight), a copy of
// each buffer. No collective.
StateDict deferred_state_dict(const FullyShardedDataParallel& model, const std::string& prefix);

// Gathers `model`'s units one at a time (a collective: every rank calls it) and hands each
// parameter's value to `write` with its placeholder in `deferred` (deferred_state_dict(model,
// prefix)'s); `write` empty: this rank only takes part in the gathers.
using DeferredWrite = std::function<void(const torch::Tensor& placeholder, const torch::Tensor&)>;
void write_gathered_parameters(FullyShardedDataParallel& model, const StateDict& deferred,
                               const std::string& prefix, const DeferredWrite& write);

// A rank's files written while a sharded model's units are gathered one at a time
// (write_gathered_parameters): an error stops the writing but not the gathers, which every rank
// goes through; it is kept in `error` for the caller to raise once they are done.
class StreamedFiles {
 public:
  // `path` with contents `value`, its placeholders to come from write(). Throws on error.
  PtFileWriter& open(const std::string& path, const c10::IValue& value);
  // The placeholder's data into each file that awaits it (nothing once an error is kept).
  void write(const torch::Tensor& placeholder, const torch::Tensor& data);
  // What the gathers call on this rank: write() where `writing`, nothing elsewhere.
  DeferredWrite writer(bool writing);
  std::exception_ptr error;

 private:
  std::vector<std::unique_ptr<PtFileWriter>> files_;
};

// save_weights' file of a sharded model (keys with `prefix`; kModulePrefix: nn.DataParallel's),
// written atomically by the rank where `write` is true while the units are gathered one at a
// time. Every rank calls it (a collective). An error in writing is thrown on the writing rank
// once the gathers are done, so that the others are not left waiting; `path` is then unchanged.
void save_weights(FullyShardedDataParallel& model, const std::string& path, bool write,
                  const std::string& prefix = kModulePrefix);

}  // namespace ddp::train
