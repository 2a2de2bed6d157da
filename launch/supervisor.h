#pragma once
// The launcher's process supervision: start the workers of this node, relay their output, watch
// them, stop them all when one fails, restart the group, forward SIGINT and SIGTERM.

#include <map>
#include <string>

#include "options.h"

namespace ddp::launch {

// Runs this node's workers of `program` (an executable path) until they all succeed, one fails
// for the last time, or the launcher is told to stop. Returns the launcher's exit code: 0, the
// first failed worker's exit code (128 + signal when a signal ended it), or 128 + the signal
// that stopped the launcher. Workers get `env` (the launcher's environment) plus worker_env().
// Throws InputError when the job cannot start (a busy master port).
int supervise(const LaunchOptions& options, const std::string& program,
              const std::map<std::string, std::string>& env);

}  // namespace ddp::launch
