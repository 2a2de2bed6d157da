#include "checkpoint_files.h"

#include <fmt/format.h>

#include <exception>
#include <filesystem>

#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"
#include "ddp/train/pt_file.h"
#include "torch_errors.h"

namespace ddp::train {

namespace fs = std::filesystem;

std::string describe(CheckpointPosition at) {
  return at.epoch_step == 0 ? fmt::format("after epoch {}", at.epoch)
                            : fmt::format("{} steps into epoch {}", at.epoch_step, at.epoch + 1);
}

std::string model_file_path(const Config& config) {
  return (fs::path(config.output_dir) / "model.pt").string();
}

std::string model_file_prefix(const Config& config) {
  return config.save_prefix == SavePrefix::kNone ? "" : kModulePrefix;
}

c10::IValue model_file(const StateDict& model, const Config& config) {
  return to_ivalue(with_prefix(model, model_file_prefix(config)));
}

std::string write_checkpoint_files(CheckpointPosition at, const Config& config,
                                   const std::function<void(const std::string&)>& write_numbered,
                                   const std::function<void()>& write_model) {
  const fs::path dir(config.output_dir);
  const std::string numbered = (dir / checkpoint_file_name(at)).string();
  write_numbered(numbered);
  link_atomically(numbered, (dir / "checkpoint.pt").string());
  write_model();
  remove_stale_checkpoints(dir.string(), config.keep_last);
  return numbered;
}

std::string commit_checkpoint(const Config& config, const Distributed& dist, CheckpointPosition at,
                              std::exception_ptr error,
                              const std::function<void(const std::string&)>& write_numbered,
                              const std::function<void()>& write_model) {
  const std::string what = describe(at);
  std::string numbered;  // rank 0's file
  if (dist.is_main()) {
    try {
      if (error) std::rethrow_exception(error);
      numbered = write_checkpoint_files(at, config, write_numbered, write_model);
      log::info("checkpoint {}: {}", what, numbered);
    } catch (const std::exception& e) {
      log::error("saving the checkpoint {} failed: {}", what, first_line_of(e));
      error = std::current_exception();
    }
  }
  // The barrier after every save, carrying rank 0's outcome.
  agree_all_ok(dist, error, "saving the checkpoint");
  return fmt::format("{} ({})", numbered, what);
}

std::string write_whole_checkpoint(const Config& config, const Distributed& dist,
                                   const Checkpoint& c, CheckpointPosition at) {
  return commit_checkpoint(
      config, dist, at, nullptr,
      [&](const std::string& path) { write_pt_file(path, to_ivalue(c)); },
      [&] { write_pt_file(model_file_path(config), model_file(c.model, config)); });
}

void refuse_sharded_checkpoint(const std::string& path, bool directory) {
  throw InputError(fmt::format(
      "{}: {} of a sharded checkpoint (--checkpoint-sharded), which resumes under --fsdp from "
      "its directory; model.pt holds the weights whole",
      path, directory ? "the directory" : "one rank's file"));
}

}  // namespace ddp::train
