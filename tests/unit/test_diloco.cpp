// DiLoCo and local SGD (ddp/core/diloco.h) against a Python reference written from the paper's
// Algorithm 1 with torch.optim.SGD as the outer optimizer (tests/python/diloco_reference.py):
// linear-model replicas in float64, the same data, every outer round's parameters to 1e-6.
// The outer step with two replicas averaged in this process; the DiLoCo class itself (with and
// without a delay) on a one-rank group (on 2 and 3 real ranks: DiLoCo.* in
// tests/integration/test_ddp.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "built_paths.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/core/diloco.h"
#include "diloco_reference.h"
#include "subprocess.h"

namespace {

using namespace ddp::testing::diloco;

std::map<std::string, at::Tensor> reference(int workers) {
  ddp::testing::TempDir dir;
  const std::string file = dir.file("reference.pt");
  const auto r = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/diloco_reference.py", file,
       std::to_string(workers)},
      {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_reference(file);
}

TEST(DiLoCo, TheOuterStepOfTwoReplicasIsThePapersAndLocalSgdAverages) {
  auto ref = reference(2);
  struct Variant {
    std::string name;
    double lr, mu;
    bool nesterov;
  };
  for (const Variant& v :
       {Variant{"diloco", 0.7, 0.9, true}, Variant{"local_sgd", 1.0, 0.0, false}}) {
    std::vector<at::Tensor> theta = {ref.at("W0").clone(), ref.at("b0").clone()}, momentum;
    for (int r = 0; r < kRounds; ++r) {
      std::vector<std::vector<at::Tensor>> replicas;
      for (int i = 0; i < 2; ++i) {
        std::vector<at::Tensor> w = {theta[0].clone(), theta[1].clone()};
        for (int s = r * kH; s < (r + 1) * kH; ++s) inner_step(w, ref, i, s);
        replicas.push_back(w);
      }
      std::vector<at::Tensor> grads;
      for (size_t k = 0; k < theta.size(); ++k) {
        grads.push_back(
            ((theta[k] - replicas[0][k].detach()) + (theta[k] - replicas[1][k].detach())) / 2);
      }
      ddp::outer_sgd_step(theta, momentum, grads, v.lr, v.mu, v.nesterov);
      EXPECT_LT(round_error(theta, ref, v.name, r), 1e-6) << v.name << " round " << r;
    }
  }
}

// The class on a group of one rank: its outer gradient is (global - local), all-reduced alone.
TEST(DiLoCo, TheClassSynchronizesEveryHStepsAsThePaperOnOneRank) {
  auto ref = reference(1);
  auto group = ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
  std::shared_ptr<ddp::comm::ProcessGroup> shared = std::move(group);
  std::vector<at::Tensor> w = {ref.at("W0").clone(), ref.at("b0").clone()};
  ddp::DiLoCo diloco(w, shared, {kH, 0.7, 0.9, true});
  int synced = 0;
  for (int s = 0; s < kRounds * kH; ++s) {
    inner_step(w, ref, 0, s);
    if (diloco.after_inner_step()) {
      EXPECT_LT(round_error(w, ref, "diloco", synced), 1e-6) << "round " << synced;
      ++synced;
    }
  }
  EXPECT_EQ(synced, kRounds);
}

// With a delay: the outer gradient is taken kDelay steps before each round's end, and the model
// goes on from the new global parameters plus its progress of those steps.
TEST(DiLoCo, WithADelayTheOuterStepLandsHStepsApartAsTheReference) {
  auto ref = reference(1);
  auto group = ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
  std::shared_ptr<ddp::comm::ProcessGroup> shared = std::move(group);
  std::vector<at::Tensor> w = {ref.at("W0").clone(), ref.at("b0").clone()};
  ddp::DiLoCo diloco(w, shared, {kH, 0.7, 0.9, true, kDelay});
  int synced = 0;
  for (int s = 0; s < kRounds * kH; ++s) {
    inner_step(w, ref, 0, s);
    if (diloco.after_inner_step()) {
      EXPECT_EQ(s % kH, kH - 1);
      EXPECT_LT(round_error(diloco.global_parameters(), ref, "diloco_delayed", synced), 1e-6)
          << "round " << synced;
      ++synced;
    }
  }
  EXPECT_EQ(synced, kRounds);
  // The last round's delayed steps are in no outer gradient yet: the model is not the global
  // one until synchronize_if_pending (an epoch's end) carries them.
  EXPECT_FALSE(w[0].equal(diloco.global_parameters()[0]));
  diloco.synchronize_if_pending();
  EXPECT_TRUE(w[0].equal(diloco.global_parameters()[0]));
  EXPECT_TRUE(w[1].equal(diloco.global_parameters()[1]));
}

TEST(DiLoCo, ADelayOfHOrMoreIsRefused) {
  auto group = ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
  std::shared_ptr<ddp::comm::ProcessGroup> shared = std::move(group);
  std::vector<at::Tensor> w = {torch::zeros({2})};
  EXPECT_THROW(ddp::DiLoCo(w, shared, {4, 0.7, 0.9, true, 4}), ddp::InputError);
  EXPECT_THROW(ddp::DiLoCo(w, shared, {4, 0.7, 0.9, true, -1}), ddp::InputError);
}

}  // namespace
