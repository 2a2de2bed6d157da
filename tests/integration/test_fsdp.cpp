// Fully sharded data parallelism with real ranks (fsdp_worker.cpp): each scenario's sharded model
// against one process with the whole batch, or against DDP, on every backend that has all-gather
// and reduce-scatter, under the env contract (gloo, shm, and local at world size 1) and under
// mpirun (mpi); 3 ranks leave units whose size the world does not divide (padded shards).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "built_paths.h"
#include "ranks.h"
#include "subprocess.h"

namespace {

struct Case {
  std::string scenario;
  std::string backend;
  int world;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name =
      fmt::format("{}_{}_{}ranks", info.param.scenario, info.param.backend, info.param.world);
  for (auto& c : name) c = c == '-' ? '_' : c;
  return name;
}

class Fsdp : public testing::TestWithParam<Case> {};

TEST_P(Fsdp, ShardedTrainingEqualsItsReference) {
  const auto& c = GetParam();
  const ddp::testing::TempDir dir;  // the checkpoints' files
  std::vector<std::string> argv = {DDP_FSDP_WORKER_BIN, c.backend, c.scenario};
  if (c.scenario == "checkpoints") argv.push_back(dir.path());
  std::string output;
  if (c.backend == "mpi") {
    const auto r = ddp::testing::run_mpirun(c.world, argv, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    output = r.output;
  } else {
    output = ddp::testing::expect_all_exit_zero(
        ddp::testing::run_env_ranks(c.world, argv, std::chrono::seconds(120)));
  }
  for (int r = 0; r < c.world; ++r) {
    EXPECT_NE(output.find(fmt::format("rank {}/{}: 0 failures", r, c.world)), std::string::npos)
        << output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Fsdp,
                         testing::Values(Case{"sequential", "gloo", 2},
                                         Case{"sequential", "gloo", 3},
                                         Case{"sequential", "shm", 2}, Case{"sequential", "mpi", 2},
                                         Case{"sequential", "local", 1}, Case{"custom", "gloo", 3},
                                         Case{"custom", "mpi", 2}, Case{"overlap", "gloo", 2},
                                         Case{"versus-ddp", "gloo", 2},
                                         Case{"versus-ddp", "shm", 3}, Case{"adapters", "gloo", 2},
                                         Case{"param-groups", "gloo", 3}, Case{"hybrid", "gloo", 4},
                                         Case{"hybrid", "shm", 4}, Case{"unused", "gloo", 3},
                                         Case{"unused", "shm", 2}, Case{"checkpoints", "gloo", 3}),
                         case_name);

}  // namespace
