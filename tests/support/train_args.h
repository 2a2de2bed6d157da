#pragma once
// The command lines the launcher, Slurm and several-hosts tests share: a config of this source
// tree, the short Fashion-MNIST MLP run, and `launcher OPTIONS ddp_train ARGS`. Header-only; the
// paths are the test definitions of tests/CMakeLists.txt.

#include <string>
#include <vector>
#include "built_paths.h"

namespace ddp::testing {

// configs/<name> of this source tree.
inline std::string config(const char* name) {
  return std::string(DDP_SOURCE_DIR) + "/configs/" + name;
}

// A Fashion-MNIST MLP run of `epochs` on 1200 samples, batch 32 per rank, evaluated on the first
// 1000 test images (kTestSubset), written to `out`.
// Evaluating all 10,000 after every epoch was half of such a run's CPU time (1.40 s against 0.76
// for 4 epochs on one process).
inline constexpr const char* kTestSubset = "1000";
inline std::vector<std::string> mlp_args(const std::string& out, int epochs) {
  return {"--config",       config("fashion_mnist_mlp.yaml"),
          "--data",         DDP_FASHION_MNIST_DIR,
          "--train-subset", "1200",
          "--test-subset",  kTestSubset,
          "--batch-size",   "32",
          "--epochs",       std::to_string(epochs),
          "--output-dir",   out};
}

#ifdef DDP_LAUNCHER_BIN
// launcher OPTIONS PROGRAM ARGS (ddp_train, or the tests' ddp_fault_train)
inline std::vector<std::string> launch(const std::vector<std::string>& options,
                                       const std::vector<std::string>& args,
                                       const std::string& program = DDP_TRAIN_BIN) {
  std::vector<std::string> argv = {DDP_LAUNCHER_BIN};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}
#endif

}  // namespace ddp::testing
