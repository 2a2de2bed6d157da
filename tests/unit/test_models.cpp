// The built-in models against their Python definitions: sizes, names, and outputs on weights
// that Python loads (Debian's python3-torch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/core/sync_batch_norm.h"
#include "ddp/models/resnet.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"
#include "subprocess.h"

namespace {

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

TEST(ResNet18, HasTheTutorialsSizeShapesAndNames) {
  auto net = ddp::models::make_resnet18(10, 1);
  // sum(p.numel() for p in resnet18(10).parameters()) in Python.
  EXPECT_EQ(parameter_count(*net), 11175818);
  EXPECT_EQ(parameter_count(*ddp::models::make_resnet18(100, 3)),
            11175818 - 10 * 513 + 100 * 513 + 2 * 9 * 64);
  const auto out = net->forward(torch::randn({2, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));

  std::vector<std::string> keys;
  for (const auto& [key, tensor] : ddp::train::state_dict(*net)) keys.push_back(key);
  ASSERT_GE(keys.size(), 10u);
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 3),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight"}));
  EXPECT_EQ(keys[6], "1.num_batches_tracked");
  EXPECT_EQ(keys[7], "resnet_block1.0.conv1.weight");
  EXPECT_NE(std::find(keys.begin(), keys.end(), "resnet_block2.0.conv3.weight"), keys.end());
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "resnet_block2.1.conv3.weight"), keys.end());
  EXPECT_EQ(keys.back(), "fc.1.bias");
}

TEST(ResNet18, IsInitialisedAsTheTutorial) {
  torch::manual_seed(0);
  auto net = ddp::models::make_resnet18();
  for (const auto& [key, tensor] : ddp::train::state_dict(*net)) {
    const bool conv_or_linear_weight =
        key.size() > 7 && key.compare(key.size() - 7, 7, ".weight") == 0 && tensor.dim() >= 2;
    if (conv_or_linear_weight && tensor.numel() > 1000) {
      EXPECT_NEAR(tensor.std().item<double>(), 0.01, 0.001) << key;
      EXPECT_NEAR(tensor.mean().item<double>(), 0.0, 0.001) << key;
    }
  }
}

TEST(ResNet18, PythonLoadsItsWeightsIntoTheTutorialsModelWithEqualOutputs) {
  ddp::testing::TempDir dir;
  torch::manual_seed(3);
  auto net = ddp::models::make_resnet18();
  // A few training-mode passes, so that BatchNorm's running statistics are not the defaults.
  for (int i = 0; i < 3; ++i) net->forward(torch::randn({8, 1, 28, 28}) * 2 + 0.5);
  net->eval();
  ddp::train::save_weights(*net, dir.file("model.pt"));
  torch::NoGradGuard no_grad;
  const auto input = torch::randn({4, 1, 28, 28});
  c10::impl::GenericDict batch(c10::StringType::get(), c10::AnyType::get());
  batch.insert("input", input);
  batch.insert("output", net->forward(input));
  ddp::train::write_pt_file(dir.file("batch.pt"), batch);
  auto r = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/checkpoint_interop.py",
       "check-ours", dir.path(), "resnet18", "1e-4"},
      {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'module.resnet_block4.1.bn2.running_var'"), std::string::npos)
      << r.output;
}

}  // namespace

namespace {

// --sync-bn builds the model with SyncBatchNorm layers: the same names (so the same weights files)
// and, on one rank, the same outputs as BatchNorm in training and eval mode.
TEST(ResNet18, WithSyncBatchNormHasTheSameStateDictAndOutputs) {
  torch::manual_seed(5);
  auto plain = ddp::models::make_resnet18();
  auto synced = ddp::models::make_resnet18(10, 1, [](int64_t channels) {
    return torch::nn::AnyModule(ddp::SyncBatchNorm(channels, nullptr));
  });
  const auto a = ddp::train::state_dict(*plain), b = ddp::train::state_dict(*synced);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].first, b[i].first);
  ddp::testing::TempDir dir;
  ddp::train::save_weights(*plain, dir.file("w.pt"));
  ddp::train::load_weights(*synced, dir.file("w.pt"));
  const auto x = torch::randn({4, 1, 28, 28});
  EXPECT_LE((plain->forward(x) - synced->forward(x)).abs().max().item<double>(), 1e-4);
  plain->eval();
  synced->eval();
  EXPECT_LE((plain->forward(x) - synced->forward(x)).abs().max().item<double>(), 1e-4);
}

}  // namespace
