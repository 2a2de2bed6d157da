// The YAML config loader and its cross-key checks on arbitrary text (through a file, as users
// give it).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ddp/common/error.h"
#include "ddp/train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/ddp_fuzz_config_" + std::to_string(::getpid()) + ".yaml";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    ddp::train::Config config;
    ddp::train::apply_config_file(config, path);
    ddp::train::validate(config);
    ddp::train::to_yaml(config);
  } catch (const ddp::InputError&) {
  }
  return 0;
}
