#pragma once
// Errors of the project. Library code throws; only main() catches, logs and chooses the exit code.

#include <stdexcept>
#include <string>

namespace ddp {

// Exit codes of the programs (docs/training.md, "Exit codes").
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;   // a run that failed after it started (communication, I/O)
constexpr int kExitBadInput = 2;  // bad input: config, CLI, env, data files

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = kExitFailure)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const noexcept { return exit_code_; }

 private:
  int exit_code_;
};

// Input the user can fix: a config key, a CLI value, an env variable, a data file.
// The message names the file, line, key or variable and what was expected.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what, kExitBadInput) {}
};

// "file:line: message" for internal invariants (DDP_CHECK).
[[noreturn]] void throw_check_failure(const char* file, int line, const char* expr,
                                      const std::string& message);

}  // namespace ddp

// Checks an internal invariant; a failure is a bug in ddp, reported with file and line.
#define DDP_CHECK(cond, message)                                                   \
  do {                                                                             \
    if (!(cond)) ::ddp::throw_check_failure(__FILE__, __LINE__, #cond, (message)); \
  } while (0)
