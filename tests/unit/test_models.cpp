// The built-in models against their Python definitions: sizes, names, and outputs on weights
// that Python loads (Debian's python3-torch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "built_paths.h"
#include "ddp/common/error.h"
#include "ddp/core/sync_batch_norm.h"
#include "ddp/models/informer.h"
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

// The Informer: ProbSparse attention, shapes through encoder and decoder, and the same outputs as
// the Python Informer (bench/informer_reference.py, Informer2020's model) on the same weights.
namespace {

using ddp::models::InformerOptions;

InformerOptions small_informer(int64_t seq_len, int64_t label_len, int64_t pred_len) {
  InformerOptions o;
  o.enc_in = o.dec_in = 5;
  o.c_out = 3;
  o.seq_len = seq_len;
  o.label_len = label_len;
  o.pred_len = pred_len;
  o.d_model = 32;
  o.n_heads = 4;
  o.d_ff = 48;
  return o;
}

// Marks as the CSV reader makes them: month 1-12, day 1-31, weekday 0-6, hour 0-23.
torch::Tensor random_marks(int64_t batch, int64_t length) {
  return torch::stack(
             {torch::randint(1, 13, {batch, length}), torch::randint(1, 32, {batch, length}),
              torch::randint(0, 7, {batch, length}), torch::randint(0, 24, {batch, length})},
             -1)
      .to(torch::kFloat);
}

TEST(Informer, ProbSparseAttentionWithEveryQueryIsFullAttention) {
  torch::manual_seed(0);
  torch::nn::Dropout no_dropout(0.0);
  // {queries, keys, masked}; factor 100 keeps every query and samples every key.
  for (auto [L, S, masked] : {std::tuple{72, 48, false},
                              {96, 96, false},
                              {72, 72, true},
                              {40, 40, true},
                              {1, 9, false}}) {
    const auto q = torch::randn({2, L, 4, 16}), k = torch::randn({2, S, 4, 16}),
               v = torch::randn({2, S, 4, 8});
    const auto full = ddp::models::full_attention(q, k, v, masked, no_dropout);
    const auto prob = ddp::models::prob_attention(q, k, v, 100, masked);
    ASSERT_EQ(prob.sizes(), (std::vector<int64_t>{2, L, 4, 8}));
    EXPECT_LE((prob - full).abs().max().item<double>(), 1e-5) << L << " " << S << " " << masked;
  }
}

TEST(Informer, ProbSparseAttentionKeepsCTimesLnLQueries) {
  torch::manual_seed(1);
  // L = 96, c = 5: u = 5 * ceil(ln 96) = 25 queries attend; the other 71 get the mean of V
  // (unmasked) or the running sum of V (masked).
  const auto q = torch::randn({1, 96, 1, 8}), k = torch::randn({1, 96, 1, 8}),
             v = torch::randn({1, 96, 1, 8});
  const auto out = ddp::models::prob_attention(q, k, v, 5, false);
  const auto lazy = (out - v.mean(1, true)).abs().amax({2, 3}).lt(1e-6).sum().item<int64_t>();
  EXPECT_EQ(lazy, 96 - 25);
  const auto masked = ddp::models::prob_attention(q, k, v, 5, true);
  const auto running = (masked - v.cumsum(1)).abs().amax({2, 3}).lt(1e-5).sum().item<int64_t>();
  EXPECT_GE(running, 96 - 25);  // a chosen query may see almost only itself: then they agree too
  EXPECT_LT(running, 96);
}

TEST(Informer, ShapesThroughEncoderWithDistillingAndDecoder) {
  torch::manual_seed(2);
  // {seq_len, label_len, pred_len, e_layers, encoder output length}: distilling halves the length
  // (rounding up) between encoder layers.
  for (auto [seq, label, pred, layers, encoded] : {std::tuple{96, 48, 24, 2, 48},
                                                   {96, 48, 24, 3, 24},
                                                   {97, 0, 5, 3, 25},
                                                   {48, 24, 48, 1, 48},
                                                   {7, 7, 1, 4, 1}}) {
    auto o = small_informer(seq, label, pred);
    o.e_layers = layers;
    ddp::models::Informer net(o);
    const auto x_enc = torch::randn({3, seq, 5}), mark_enc = random_marks(3, seq);
    const auto x_dec = torch::randn({3, label + pred, 5}), mark_dec = random_marks(3, label + pred);
    EXPECT_EQ(net->encode(x_enc, mark_enc).sizes(), (std::vector<int64_t>{3, encoded, 32}))
        << seq << " " << layers;
    const auto out = net->forward(x_enc, mark_enc, x_dec, mark_dec);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{3, pred, 3})) << seq << " " << pred;
    // Every parameter takes part (DDP needs no find-unused-parameters). Attention over a single
    // key has zero query and key gradients: its weight is 1 whatever they are.
    out.sum().backward();
    for (const auto& item : net->named_parameters()) {
      const auto& grad = item.value().grad();
      ASSERT_TRUE(grad.defined()) << item.key();
      if (encoded > 1) {
        EXPECT_GT(grad.abs().sum().item<double>(), 0) << item.key();
      }
    }
  }
}

TEST(Informer, BadSizesAreInputErrors) {
  auto o = small_informer(96, 48, 24);
  o.n_heads = 5;
  EXPECT_THROW(ddp::models::Informer{o}, ddp::InputError);
  o = small_informer(24, 48, 24);
  EXPECT_THROW(ddp::models::Informer{o}, ddp::InputError);
}

TEST(Informer, PythonLoadsItsWeightsIntoInformer2020sModelWithEqualOutputs) {
  ddp::testing::TempDir dir;
  torch::manual_seed(4);
  // Factor 20 keeps every query of lengths 96, 72 and 48: no random sampling on either side.
  auto o = small_informer(96, 48, 24);
  o.factor = 20;
  ddp::models::Informer net(o);
  for (int i = 0; i < 3; ++i) {  // BatchNorm statistics away from their defaults
    net->encode(torch::randn({4, 96, 5}) * 2 + 1, random_marks(4, 96));
  }
  net->eval();
  ddp::train::save_weights(*net, dir.file("model.pt"));
  torch::NoGradGuard no_grad;
  c10::impl::GenericDict batch(c10::StringType::get(), c10::AnyType::get());
  const auto x_enc = torch::randn({4, 96, 5}), mark_enc = random_marks(4, 96);
  const auto x_dec = torch::cat({torch::randn({4, 48, 5}), torch::zeros({4, 24, 5})}, 1);
  const auto mark_dec = random_marks(4, 72);
  batch.insert("x_enc", x_enc);
  batch.insert("mark_enc", mark_enc);
  batch.insert("x_dec", x_dec);
  batch.insert("mark_dec", mark_dec);
  batch.insert("output", net->forward(x_enc, mark_enc, x_dec, mark_dec));
  for (auto [name, value] : {std::pair{"enc_in", o.enc_in},
                             {"dec_in", o.dec_in},
                             {"c_out", o.c_out},
                             {"seq_len", o.seq_len},
                             {"label_len", o.label_len},
                             {"pred_len", o.pred_len},
                             {"factor", o.factor},
                             {"d_model", o.d_model},
                             {"n_heads", o.n_heads},
                             {"e_layers", o.e_layers},
                             {"d_layers", o.d_layers},
                             {"d_ff", o.d_ff}}) {
    batch.insert(name, torch::tensor(value));
  }
  ddp::train::write_pt_file(dir.file("batch.pt"), batch);
  auto r = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/checkpoint_interop.py",
       "check-informer", dir.path(), "1e-4"},
      {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("75 keys"), std::string::npos) << r.output;
}

}  // namespace
