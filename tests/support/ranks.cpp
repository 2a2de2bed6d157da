#include "ranks.h"

#include <memory>

namespace ddp::testing {

std::vector<ProcessResult> run_env_ranks(int world, const std::vector<std::string>& argv,
                                         std::chrono::seconds limit,
                                         const std::map<std::string, std::string>& extra) {
  const int port = free_port();
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = {
        {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)}};
    for (const auto& [k, v] : extra) env[k] = v;
    children.push_back(std::make_unique<Child>(argv, env));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<ProcessResult> results;
  for (auto& child : children) results.push_back(child->wait_until(deadline));
  return results;
}

ProcessResult run_mpirun(int np, const std::vector<std::string>& argv, std::chrono::seconds limit) {
  std::vector<std::string> cmd = {
      DDP_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
      "-np",       std::to_string(np)};
  cmd.insert(cmd.end(), argv.begin(), argv.end());
  return run_process(cmd, {}, limit);
}

}  // namespace ddp::testing
