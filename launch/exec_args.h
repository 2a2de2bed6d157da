#pragma once
// A program's arguments and environment as execve(2) takes them, made before fork(): after it,
// the child may only make exec-safe calls, and these arrays need no allocation.

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launch {

class ExecArgs {
 public:
  ExecArgs(std::vector<std::string> args, const std::map<std::string, std::string>& env)
      : args_(std::move(args)) {
    for (const auto& [k, v] : env) env_.push_back(k + "=" + v);
    for (auto& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    for (auto& e : env_) envp_.push_back(e.data());
    envp_.push_back(nullptr);
  }
  ExecArgs(const ExecArgs&) = delete;  // the arrays point into the strings
  ExecArgs& operator=(const ExecArgs&) = delete;

  char* const* argv() const { return argv_.data(); }
  char* const* envp() const { return envp_.data(); }

 private:
  std::vector<std::string> args_, env_;
  std::vector<char*> argv_, envp_;
};

}  // namespace ddp::launch
