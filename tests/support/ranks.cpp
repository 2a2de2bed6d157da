#include "ranks.h"
#include "built_paths.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

namespace ddp::testing {

namespace {

std::vector<ProcessResult> run_env_ranks_on(int port, int world,
                                            const std::vector<std::string>& argv,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::map<std::string, std::string>& extra) {
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env = {
        {"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)}};
    for (const auto& [k, v] : extra) env[k] = v;
    children.push_back(std::make_unique<Child>(argv, env));
  }
  std::vector<ProcessResult> results;
  for (auto& child : children) {
    results.push_back(child->wait_until(deadline));
    // Rank 0 could not bind: the others would wait for it until the deadline.
    if (results.size() == 1 && port_was_taken(results[0])) {
      for (std::size_t r = 1; r < children.size(); ++r) children[r]->kill_group();
    }
  }
  return results;  // one per rank, always
}

}  // namespace

bool port_was_taken(const ProcessResult& rank0) {
  return rank0.exit_code != 0 && rank0.output.find("is already in use") != std::string::npos;
}

// A port free when chosen can still be bound by a process outside the tests before rank 0 binds
// it; such a job never started, and runs again on another port (twice at most).
std::vector<ProcessResult> run_env_ranks(int world, const std::vector<std::string>& argv,
                                         std::chrono::seconds limit,
                                         const std::map<std::string, std::string>& extra) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int attempt = 1;; ++attempt) {
    const int port = free_port();
    auto results = run_env_ranks_on(port, world, argv, deadline, extra);
    if (!port_was_taken(results[0]) || attempt == 3) return results;
    std::fprintf(stderr, "[test] MASTER_PORT %d was taken before rank 0 bound it: again\n", port);
  }
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
