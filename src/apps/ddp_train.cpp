// ddp_train: trains a built-in workload from a YAML config, every key also settable on the
// command line (the command line wins). The only place that exits.

#include "train_main.h"

int main(int argc, char** argv) {
  return ddp::apps::train_main(
      argc, argv,
      [](const ddp::train::Config& config, std::optional<ddp::train::Workload> preloaded) {
        return ddp::train::Trainer(config, {}, std::move(preloaded)).run();
      });
}
