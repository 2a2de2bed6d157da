#pragma once
// ddp_train's command line and main, as a function: the program (ddp_train.cpp) is one call to it,
// and a test program links the same command line with a Trainer of its own making (the tests'
// fault injection wraps the process group; tests/support/fault_train.cpp).

#include <functional>
#include <optional>

#include "ddp/train/config.h"
#include "ddp/train/trainer.h"

namespace ddp::apps {

// Builds and runs the training of a resolved config: ddp_train's is
// Trainer(config, {}, preloaded).run(). `preloaded` is the workload a warm spare made before it
// forked this worker (the launcher's --warm-spare), to be given to the Trainer; else nullopt.
using TrainRun = std::function<train::TrainResult(const train::Config&,
                                                  std::optional<train::Workload> preloaded)>;

// Answers --help, --version, --list-devices, --make-timeseries-csv and --diagnose, or resolves the
// config (defaults, the --config file, the command line), installs the signal handlers (SIGUSR1:
// a flight record; SIGTERM with --checkpoint-on-signal: stop after the step) and calls `run`; in
// the launcher's warm spare, makes the workload and calls `run` in each worker it forks.
// Every error is logged on this rank; returns the exit status. ddp_train's command line is read
// with cxxopts here (the launcher reads its own in launch/options.cpp).
int train_main(int argc, char** argv, const TrainRun& run);

}  // namespace ddp::apps
