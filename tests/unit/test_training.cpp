// Training end to end in one process: the loss falls and the MLP learns Fashion-MNIST.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/train/trainer.h"
#include "subprocess.h"

namespace {

using ddp::train::Config;

TEST(Training, MlpOneEpochOnFashionMnistReachesEightyPercent) {
  ddp::testing::TempDir dir;
  Config c;
  c.data = DDP_FASHION_MNIST_DIR;
  c.epochs = 1;
  c.threads = 2;
  c.output_dir = dir.path();
  c.log_level = "warn";
  ddp::train::Trainer trainer(c);
  const double initial_loss = trainer.evaluate().loss;
  auto result = trainer.run();
  ASSERT_EQ(result.epochs.size(), 1U);
  const auto& m = result.epochs[0];
  EXPECT_NEAR(initial_loss, std::log(10.0), 0.2);  // an untrained net guesses uniformly
  EXPECT_LT(*m.test_loss, 0.6);
  EXPECT_LT(m.train_loss, initial_loss);
  EXPECT_GE(*m.test_accuracy, 0.80);
  EXPECT_EQ(m.steps, (60000 + 63) / 64);
  // The metrics file holds the same epoch.
  EXPECT_EQ(ddp::testing::read_file(result.metrics_path), ddp::train::to_json(m) + "\n");
}

TEST(Training, LinearDemoFitsTheRandomData) {
  ddp::testing::TempDir dir;
  Config c;
  c.model = "linear";
  c.dataset = "random";
  c.epochs = 20;
  c.batch_size = 30;
  c.lr = 0.05;
  c.output_dir = dir.path();
  c.log_level = "warn";
  ddp::train::Trainer trainer(c);
  const double initial = trainer.evaluate().loss;
  auto result = trainer.run();
  EXPECT_FALSE(result.epochs.back().test_accuracy.has_value());  // regression: no accuracy
  EXPECT_LT(*result.epochs.back().test_loss, 0.1 * initial);
  EXPECT_EQ(result.epochs.back().steps, 20 * 4);  // 100 samples in batches of 30: 4 steps
}

TEST(Training, SameSeedSameParameters) {
  auto train_once = [](const std::string& dir) {
    Config c;
    c.model = "linear";
    c.dataset = "random";
    c.epochs = 2;
    c.optimizer = "adam";
    c.output_dir = dir;
    c.log_level = "warn";
    ddp::train::Trainer trainer(c);
    trainer.run();
    return trainer.module().parameters();
  };
  ddp::testing::TempDir a, b;
  auto pa = train_once(a.path());
  auto pb = train_once(b.path());
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
}

}  // namespace
