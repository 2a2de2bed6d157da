// Mixed precision in one process: the GradScaler's update rule, its misuse errors, and its
// state_dict through a torch.save file that Debian's python3-torch reads with PyTorch's keys and
// values; the Autocast scope's casts.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "ddp/common/error.h"
#include "ddp/core/autocast.h"
#include "ddp/core/grad_scaler.h"
#include "ddp/train/pt_file.h"
#include "subprocess.h"

namespace {

using ddp::amp::GradScaler;
using ddp::amp::GradScalerOptions;

// One step of a Linear(2, 1) whose gradient is made `poison` (1: finite).
bool step_with(GradScaler& scaler, torch::nn::Linear& net, torch::optim::SGD& optimizer,
               float poison) {
  optimizer.zero_grad();
  scaler.scale(net->forward(torch::ones({1, 2})).sum()).backward();
  net->weight.mutable_grad().mul_(poison);
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  return stepped;
}

TEST(GradScaler, BacksOffOnInfAndNanAndGrowsAfterTheInterval) {
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  GradScaler scaler(nullptr, GradScalerOptions().init_scale(8).growth_interval(3));
  const auto before = net->weight.clone();
  EXPECT_FALSE(step_with(scaler, net, optimizer, INFINITY));
  EXPECT_TRUE(torch::equal(net->weight, before));  // skipped
  EXPECT_EQ(scaler.get_scale(), 4);
  EXPECT_FALSE(step_with(scaler, net, optimizer, NAN));
  EXPECT_EQ(scaler.get_scale(), 2);
  EXPECT_TRUE(step_with(scaler, net, optimizer, 1));
  EXPECT_TRUE(step_with(scaler, net, optimizer, 1));
  EXPECT_EQ(scaler.get_scale(), 2);
  EXPECT_EQ(scaler.state().growth_tracker, 2);
  EXPECT_TRUE(step_with(scaler, net, optimizer, 1));
  EXPECT_EQ(scaler.get_scale(), 4);  // the third clean step in a row
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST(GradScaler, UnscaledGradientsAreTheTrueOnesAndMisuseIsAnError) {
  torch::nn::Linear net(2, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  GradScaler scaler(nullptr, GradScalerOptions().init_scale(1024));
  scaler.scale(net->forward(torch::ones({1, 2})).sum()).backward();
  EXPECT_TRUE(torch::equal(net->weight.grad(), torch::full({1, 2}, 1024.0f)));
  scaler.unscale_(optimizer);
  EXPECT_TRUE(torch::equal(net->weight.grad(), torch::ones({1, 2})));
  EXPECT_THROW(scaler.unscale_(optimizer), ddp::Error);
  EXPECT_TRUE(scaler.step(optimizer));
  EXPECT_THROW(scaler.step(optimizer), ddp::Error);
  scaler.update();
  EXPECT_THROW(scaler.update(), ddp::Error);
  EXPECT_THROW(GradScaler(nullptr, GradScalerOptions().backoff_factor(1.5)), ddp::InputError);
}

TEST(GradScaler, StateRoundTripsThroughATorchSaveFileThatPythonReads) {
  ddp::amp::GradScalerState state;
  state.scale = 512;
  state.growth_interval = 7;
  state.growth_tracker = 3;
  ddp::testing::TempDir dir;
  const auto path = dir.file("scaler.pt");
  ddp::train::write_pt_file(path, ddp::amp::to_ivalue(state));
  const auto back = ddp::amp::grad_scaler_state_from(ddp::train::read_pt_file(path), path);
  EXPECT_EQ(back.scale, 512);
  EXPECT_EQ(back.growth_factor, 2);
  EXPECT_EQ(back.backoff_factor, 0.5);
  EXPECT_EQ(back.growth_interval, 7);
  EXPECT_EQ(back.growth_tracker, 3);
  // PyTorch's GradScaler.state_dict() keys and types (torch/cuda/amp/grad_scaler.py).
  auto r =
      ddp::testing::run_process({DDP_PYTHON, "-c",
                                 "import sys, torch; d = torch.load(sys.argv[1]); "
                                 "print(sorted((k, type(v).__name__, v) for k, v in d.items()))",
                                 path},
                                {}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[('_growth_tracker', 'int', 3), ('backoff_factor', 'float', 0.5), "
                          "('growth_factor', 'float', 2.0), ('growth_interval', 'int', 7), "
                          "('scale', 'float', 512.0)]"),
            std::string::npos)
      << r.output;
  auto without_scale = ddp::amp::to_ivalue(state).toGenericDict();
  ASSERT_EQ(without_scale.erase("scale"), 1u);
  EXPECT_THROW(ddp::amp::grad_scaler_state_from(without_scale, path), ddp::InputError);
}

// Inside the scope a Linear layer runs in bfloat16: exactly Linear on its operands rounded to
// bfloat16. Its weights' gradients stay float32. A nested scope leaves the outer one as it was;
// after the outermost, float32 again.
TEST(Autocast, LinearRunsInBfloat16InsideTheScopeOnly) {
  torch::manual_seed(3);
  torch::nn::Linear linear(8, 4);
  const auto x = torch::randn({5, 8});
  const auto expected = torch::linear(x.to(torch::kBFloat16), linear->weight.to(torch::kBFloat16),
                                      linear->bias.to(torch::kBFloat16));
  torch::Tensor inside, after_nested;
  {
    const ddp::amp::Autocast autocast(torch::kCPU, torch::kBFloat16);
    inside = linear(x);
    { const ddp::amp::Autocast nested(torch::kCPU, torch::kBFloat16); }
    after_nested = linear(x);
  }
  EXPECT_EQ(inside.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(inside, expected));
  EXPECT_EQ(after_nested.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat);
  inside.sum().backward();
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(ddp::amp::autocast_unsupported(torch::kCPU, torch::kBFloat16), "");
}

// LibTorch 1.13's CPU kernels have no float16 matmul (ddp_train --amp fp16 on CPU says so at
// start-up); 2.x's have.
TEST(Autocast, Float16OnCpuIsSupportedFromLibTorch2) {
  const std::string reason = ddp::amp::autocast_unsupported(torch::kCPU, torch::kHalf);
  EXPECT_EQ(reason.empty(), TORCH_VERSION_MAJOR >= 2) << reason;
  // The probe leaves autocast off behind it, even when LibTorch refused.
  EXPECT_EQ(torch::linear(torch::ones({1, 2}), torch::ones({1, 2})).scalar_type(), torch::kFloat);
}

}  // namespace
