// ResNet-18 with PowerSGD against the plain all-reduce, on 2 ranks: the issue's "reach within 0.02
// accuracy of allreduce" on the CPU config. The CPU config's own 16 steps leave ResNet-18 near
// chance (0.1-0.2 test accuracy, where one run's luck is larger than 0.02), so both runs train
// it longer: the first 8,192 training samples for 2 epochs, 128 steps of batch 64 per rank, with
// a cosine schedule that ends both runs at learning rate 0, so that the final accuracy is not the
// luck of the last few large steps. About 3 minutes per run on 2 cores.
#include <gtest/gtest.h>

#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"

namespace {

using ddp::testing::metrics_field;
using ddp::testing::TempDir;

// One run of ResNet-18 on 2 ranks (gloo) with `hook_options`; its last metrics line.
std::string resnet_on_two_ranks(const std::string& out, std::vector<std::string> hook_options) {
  std::vector<std::string> argv = {
      DDP_TRAIN_BIN,
      "--config",
      std::string(DDP_SOURCE_DIR) + "/configs/fashion_mnist_resnet18_cpu.yaml",
      "--train-subset",
      "8192",
      "--epochs",
      "2",
      "--lr-schedule",
      "cosine",
      "--threads",
      "1",
      "--seed",
      "0",
      "--progress",
      "off",
      "--save-every",
      "0",
      "--output-dir",
      out};
  argv.insert(argv.end(), hook_options.begin(), hook_options.end());
  auto ranks = ddp::testing::run_env_ranks(2, argv, std::chrono::seconds(1200));
  for (const auto& r : ranks) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return {};
  }
  return ddp::testing::last_metrics(out);
}

// PowerSGD of rank 4, plain for the first 13 of the 128 steps (PyTorch's advice: about 10%).
TEST(ResNet18, PowerSgdReachesThePlainAllReducesAccuracyWithin002) {
  TempDir plain_dir, powersgd_dir;
  const auto plain = resnet_on_two_ranks(plain_dir.path(), {"--comm-hook", "allreduce"});
  ASSERT_FALSE(plain.empty());
  const auto powersgd = resnet_on_two_ranks(
      powersgd_dir.path(),
      {"--comm-hook", "powersgd", "--powersgd-rank", "4", "--powersgd-start-iter", "13"});
  ASSERT_FALSE(powersgd.empty());
  EXPECT_EQ(metrics_field(plain, "steps"), 128);
  // Trained: far above chance, so that "within 0.02" compares two trained models.
  EXPECT_GT(metrics_field(plain, "test_accuracy"), 0.75) << plain;
  EXPECT_NEAR(metrics_field(powersgd, "test_accuracy"), metrics_field(plain, "test_accuracy"), 0.02)
      << powersgd << "\n"
      << plain;
  // The last epoch is all compressed: ResNet-18's 44.7 MB of float32 gradients per step become
  // its rank-4 factors and the uncompressed 1-D tensors, under 2 % of that.
  EXPECT_LT(metrics_field(powersgd, "grad_bytes_per_step"),
            0.02 * metrics_field(plain, "grad_bytes_per_step"));
}

}  // namespace
