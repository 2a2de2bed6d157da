// The learning-rate schedule against its closed forms.
#include <gtest/gtest.h>

#include <cmath>

#include "ddp/train/lr_schedule.h"

namespace {

using ddp::train::lr_at;
using ddp::train::LrSchedule;

TEST(LrSchedule, ConstantIsConstant) {
  LrSchedule s;
  s.base_lr = 0.3;
  EXPECT_DOUBLE_EQ(lr_at(s, 0, 10), 0.3);
  EXPECT_DOUBLE_EQ(lr_at(s, 999, 10), 0.3);
}

TEST(LrSchedule, WarmupRisesLinearlyToBase) {
  LrSchedule s;
  s.base_lr = 1.0;
  s.warmup_epochs = 2;
  s.total_epochs = 5;
  EXPECT_DOUBLE_EQ(lr_at(s, 0, 10), 1.0 / 20);
  EXPECT_DOUBLE_EQ(lr_at(s, 9, 10), 10.0 / 20);
  EXPECT_DOUBLE_EQ(lr_at(s, 19, 10), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 20, 10), 1.0);
}

TEST(LrSchedule, StepDecaysEveryStepSizeEpochs) {
  LrSchedule s;
  s.kind = "step";
  s.base_lr = 1.0;
  s.step_size = 2;
  s.gamma = 0.5;
  s.total_epochs = 10;
  EXPECT_DOUBLE_EQ(lr_at(s, 19, 10), 1.0);   // epoch 1
  EXPECT_DOUBLE_EQ(lr_at(s, 20, 10), 0.5);   // epoch 2
  EXPECT_DOUBLE_EQ(lr_at(s, 45, 10), 0.25);  // epoch 4
}

TEST(LrSchedule, CosineFallsToZeroAfterWarmup) {
  LrSchedule s;
  s.kind = "cosine";
  s.base_lr = 2.0;
  s.warmup_epochs = 1;
  s.total_epochs = 5;
  EXPECT_DOUBLE_EQ(lr_at(s, 10, 10), 2.0);    // end of warm-up
  EXPECT_NEAR(lr_at(s, 30, 10), 1.0, 1e-12);  // half way through the cosine
  EXPECT_NEAR(lr_at(s, 20, 10), 1.0 + std::cos(M_PI / 4), 1e-12);
  EXPECT_NEAR(lr_at(s, 50, 10), 0.0, 1e-12);
}

}  // namespace

namespace {

TEST(LrScaling, LinearScalesByTheGlobalBatchOverTheReference) {
  EXPECT_DOUBLE_EQ(ddp::train::scaled_lr(0.1, ddp::train::LrScaling::kLinear, 512, 256), 0.2);
  EXPECT_DOUBLE_EQ(ddp::train::scaled_lr(0.1, ddp::train::LrScaling::kLinear, 64, 256), 0.025);
  EXPECT_DOUBLE_EQ(ddp::train::scaled_lr(0.1, ddp::train::LrScaling::kNone, 512, 256), 0.1);
}

}  // namespace
