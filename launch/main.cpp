// launcher: torchrun's job for any program, without LibTorch (docs/launching.md).
#include <fmt/format.h>
#include <unistd.h>  // environ (declared with _GNU_SOURCE, which g++ and clang++ define)

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "options.h"
#include "supervisor.h"

namespace {

std::map<std::string, std::string> current_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

// NVIDIA's driver lists one directory per GPU; no CUDA library is needed to count them.
int gpus_present() {
  std::error_code ec;
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    ++count;
  }
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto env = current_env();
    const auto options = ddp::launch::parse_launch_args(
        std::vector<std::string>(argv + 1, argv + argc), env, gpus_present(),
        static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
    if (options.help) {
      fmt::print("{}", ddp::launch::launch_help());
      return 0;
    }
    const char* path = std::getenv("PATH");
    const auto program = ddp::launch::find_program(options.program[0], path ? path : "");
    if (!program) {
      throw ddp::InputError(fmt::format("program '{}' not found (not in PATH, or not executable)",
                                        options.program[0]));
    }
    return ddp::launch::supervise(options, *program, env);
  } catch (const ddp::Error& e) {
    fmt::print(stderr, "launcher: error: {}\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    fmt::print(stderr, "launcher: error: {}\n", e.what());
    return ddp::kExitFailure;
  }
}
