// One GPU that two ranks share on gloo, which takes CUDA tensors through host copies (NCCL refuses
// two ranks on one GPU): gloo's collectives of CUDA tensors against closed forms, DDP against one
// process with the whole batch, fp16 autocast's GradScaler skipping on every rank the step of an
// inf on one. Each test skips, saying why, where no GPU is visible or gloo is not built.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "built_paths.h"
#include "ddp/comm/rendezvous.h"
#include "ranks.h"

namespace {

using ddp::testing::ProcessResult;
using std::chrono::seconds;

// Why these tests cannot run here, or "" when they can.
std::string one_gpu_skip_reason() {
  const auto built = ddp::comm::compiled_backends();
  if (std::find(built.begin(), built.end(), "gloo") == built.end()) {
    return "gloo backend not compiled in (a wheel ships no gloo headers: scripts/gpu-kit.sh takes "
           "them from DDP_GLOO_SOURCE)";
  }
  if (!torch::cuda::is_available()) return "no CUDA GPU visible";
  return "";
}

#define SKIP_WITHOUT_A_GPU()                          \
  do {                                                \
    const std::string reason = one_gpu_skip_reason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;      \
  } while (0)

// Two ranks of the worker on gloo, sharing cuda:0; each exited 0 and said who it was.
std::vector<ProcessResult> two_ranks_on_one_gpu(const std::string& scenario) {
  auto ranks = ddp::testing::run_env_ranks(2, {DDP_TWO_GPU_WORKER_BIN, scenario, "gloo"},
                                           seconds(240), {{"CUDA_VISIBLE_DEVICES", "0"}});
  EXPECT_EQ(ranks.size(), 2u);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
    EXPECT_NE(ranks[r].output.find(fmt::format("rank {}/2 on cuda:0: ", r)), std::string::npos)
        << ranks[r].output;
  }
  return ranks;
}

TEST(OneGpu, GlooTakesCudaTensorsAndMatchesTheClosedForms) {
  SKIP_WITHOUT_A_GPU();
  for (const auto& r : two_ranks_on_one_gpu("collectives")) {
    EXPECT_NE(r.output.find(" checks, 0 failures"), std::string::npos) << r.output;
  }
}

TEST(OneGpu, DdpOfTwoRanksSharingItOnGlooEqualsOneProcessWithTheWholeBatch) {
  SKIP_WITHOUT_A_GPU();
  for (const auto& r : two_ranks_on_one_gpu("ddp")) {
    EXPECT_NE(r.output.find("parameters on cuda:0"), std::string::npos) << r.output;
  }
}

TEST(OneGpu, Fp16GradScalerSkipsOnEveryRankTheStepOfAnInfOnOne) {
  SKIP_WITHOUT_A_GPU();
  for (const auto& r : two_ranks_on_one_gpu("grad-scaler")) {
    EXPECT_NE(r.output.find("skip:512 step:512 step:1024 step:1024 step:2048; step 0 left the "
                            "parameters unchanged; the ranks' parameters agree; finite"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
