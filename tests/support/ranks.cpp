#include "ranks.h"
#include "built_paths.h"

#include <gtest/gtest.h>

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

std::vector<std::string> mpirun_argv(int np) {
  return {DDP_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
          "-np",       std::to_string(np)};
}

ProcessResult run_mpirun(int np, const std::vector<std::string>& argv, std::chrono::seconds limit) {
  auto cmd = mpirun_argv(np);
  cmd.insert(cmd.end(), argv.begin(), argv.end());
  return run_process(cmd, {}, limit);
}

std::string expect_all_exit_zero(const std::vector<ProcessResult>& ranks) {
  std::string all;
  for (const auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    all += r.output;
  }
  return all;
}

bool run_python_reference(const std::string& script, int world, const std::string& out_dir) {
  const auto ranks = run_env_ranks(
      world, {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/" + script, out_dir},
      std::chrono::seconds(240));
  expect_all_exit_zero(ranks);
  for (const auto& r : ranks) {
    if (r.exit_code != 0) return false;
  }
  return true;
}

}  // namespace ddp::testing
