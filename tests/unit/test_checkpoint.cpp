// Weights files and checkpoints: the torch.save format both ways (against Debian's python3-torch),
// key mapping, the checkpoint's contents and the decisions around it, atomic writes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>

#include "built_paths.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/models/sequential_models.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/metrics.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"
#include "errors.h"
#include "subprocess.h"

namespace {

using ddp::testing::input_error_of;

using ddp::InputError;
using ddp::testing::TempDir;
namespace train = ddp::train;

std::string python_script() {
  return std::string(DDP_SOURCE_DIR) + "/tests/python/checkpoint_interop.py";
}

// DIR/batch.pt as checkpoint_interop.py reads it: an input and the output `net` gives it.
void write_batch(TempDir& dir, torch::nn::Sequential& net) {
  const auto input = torch::randn({16, 1, 28, 28});
  c10::impl::GenericDict batch(c10::StringType::get(), c10::AnyType::get());
  batch.insert("input", input);
  batch.insert("output", net->forward(input).detach());
  train::write_pt_file(dir.file("batch.pt"), batch);
}

c10::impl::GenericDict sample_dict() {
  c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
  inner.insert("weight", torch::arange(6, torch::kFloat).view({2, 3}));
  inner.insert("count", torch::tensor({7}, torch::kLong));
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("name", std::string("mlp"));
  dict.insert("epoch", int64_t{3});
  dict.insert("big", int64_t{1} << 40);
  dict.insert("negative", int64_t{-5});
  dict.insert("flag", true);
  dict.insert("model", inner);
  dict.insert("half", torch::ones({4}, torch::kHalf));
  dict.insert("bytes", torch::tensor({1, 2, 255}, torch::kByte));
  return dict;
}

TEST(PtFile, WhatWeWriteWeReadBack) {
  const c10::IValue back = train::parse_pt(train::serialize_pt(sample_dict()), "memory");
  ASSERT_TRUE(back.isGenericDict());
  auto d = back.toGenericDict();
  EXPECT_EQ(d.at("name").toStringRef(), "mlp");
  EXPECT_EQ(d.at("epoch").toInt(), 3);
  EXPECT_EQ(d.at("big").toInt(), int64_t{1} << 40);
  EXPECT_EQ(d.at("negative").toInt(), -5);
  EXPECT_TRUE(d.at("flag").toBool());
  auto inner = d.at("model").toGenericDict();
  EXPECT_TRUE(
      torch::equal(inner.at("weight").toTensor(), torch::arange(6, torch::kFloat).view({2, 3})));
  EXPECT_TRUE(torch::equal(inner.at("count").toTensor(), torch::tensor({7}, torch::kLong)));
  EXPECT_TRUE(torch::equal(d.at("half").toTensor(), torch::ones({4}, torch::kHalf)));
  EXPECT_TRUE(torch::equal(d.at("bytes").toTensor(), torch::tensor({1, 2, 255}, torch::kByte)));
}

// A tensor with a dimension of size 0 after one that is not ([3, 0]: a row of no bytes per rank)
// has no element and needs no storage.
TEST(PtFile, ATensorWithAnEmptyDimensionReadsBack) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rows", torch::empty({3, 0}, torch::kUInt8));
  const c10::IValue back = train::parse_pt(train::serialize_pt(dict), "memory");
  EXPECT_EQ(back.toGenericDict().at("rows").toTensor().sizes(), (std::vector<int64_t>{3, 0}));
}

TEST(PtFile, AFileStreamedAsItsTensorsArriveReadsAsTheOneWrittenWhole) {
  TempDir dir;
  const auto w = torch::arange(6, torch::kFloat).view({2, 3});
  const auto b = torch::tensor({7.0, 8.0}, torch::kDouble);
  const auto later_w = train::PtFileWriter::deferred({2, 3}, torch::kFloat);
  const auto later_b = train::PtFileWriter::deferred({2}, torch::kDouble);
  EXPECT_TRUE(train::PtFileWriter::is_deferred(later_w));
  EXPECT_FALSE(train::PtFileWriter::is_deferred(w));
  c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
  value.insert("w", later_w);
  value.insert("tied", later_w);  // a tied weight: one placeholder under two keys
  value.insert("b", later_b);
  value.insert("now", torch::ones({3}));
  value.insert("epoch", int64_t{4});
  {
    train::PtFileWriter file(dir.file("s.pt"));
    file.begin(value);
    EXPECT_FALSE(std::filesystem::exists(dir.file("s.pt")));  // not before commit()
    EXPECT_TRUE(file.awaits(later_b) && file.awaits(later_w));
    file.write(later_b, b);  // in any order
    file.write(later_w, w);
    EXPECT_FALSE(file.awaits(later_w));
    file.commit();
  }
  const auto back = train::read_pt_file(dir.file("s.pt")).toGenericDict();
  EXPECT_TRUE(torch::equal(back.at("w").toTensor(), w));
  EXPECT_TRUE(torch::equal(back.at("b").toTensor(), b));
  EXPECT_TRUE(torch::equal(back.at("now").toTensor(), torch::ones({3})));
  EXPECT_EQ(back.at("epoch").toInt(), 4);
  // The tied pair is one storage in the file, as torch.save writes a shared tensor.
  EXPECT_EQ(back.at("tied").toTensor().data_ptr(), back.at("w").toTensor().data_ptr());

  // A placeholder never written: an error at commit(), and neither the file nor a temp file.
  {
    train::PtFileWriter file(dir.file("missing.pt"));
    file.begin(value);
    file.write(later_w, w);
    try {
      file.commit();
      ADD_FAILURE() << "no error";
    } catch (const ddp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("1 tensor(s) not written"), std::string::npos)
          << e.what();
    }
  }
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"s.pt"});
}

TEST(PtFile, BadFilesAreInputErrorsNamingTheFile) {
  EXPECT_NE(input_error_of([] { train::parse_pt("", "a.pt"); }).find("a.pt: empty file"),
            std::string::npos);
  EXPECT_NE(input_error_of([] {
              train::parse_pt("hello world", "a.pt");
            }).find("a.pt: not a PyTorch zip file"),
            std::string::npos);
  // A TorchScript archive, what torch::save(module) writes.
  std::ostringstream script;
  torch::save(ddp::models::make_linear(5, 2), script);
  EXPECT_NE(input_error_of([&] { train::parse_pt(script.str(), "m.pt"); }).find("TorchScript"),
            std::string::npos);

  // Every truncation of a valid file, and damage anywhere in it: an error, never a crash.
  const std::string good = train::serialize_pt(sample_dict());
  int cuts = 0, rejected = 0;
  for (size_t cut = 1; cut < good.size(); cut += 97, ++cuts) {
    const std::string error =
        input_error_of([&] { train::parse_pt(std::string_view(good).substr(0, cut), "t.pt"); });
    rejected += error.rfind("t.pt: ", 0) == 0;
  }
  EXPECT_GT(cuts, 10);
  EXPECT_EQ(rejected, cuts);
  for (size_t at = 0; at < good.size(); at += 13) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    try {
      train::parse_pt(bad, "d.pt");  // damage in tensor bytes or padding can go unnoticed
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("d.pt: ", 0), 0u) << e.what();
    }
  }
}

TEST(StateDictKeys, ModulePrefixesAreCountedOnlyWhenEveryKeyHasThem) {
  EXPECT_EQ(train::common_module_prefixes({"module.a", "module.b.c"}), 1u);
  EXPECT_EQ(train::common_module_prefixes({"module.module.a", "module.module.b"}), 2u);
  EXPECT_EQ(train::common_module_prefixes({"module.a", "b"}), 0u);
  EXPECT_EQ(train::common_module_prefixes({"modules.a"}), 0u);
  EXPECT_EQ(train::common_module_prefixes({"module."}), 0u);
  EXPECT_EQ(train::common_module_prefixes({}), 0u);
}

TEST(StateDictKeys, MismatchesAreListedWithCountsAndAtMostTenEach) {
  train::KeyShapes model = {{"a", {2}}, {"b", {3, 4}}};
  train::KeyShapes file = {{"module.a", {2}}, {"module.b", {4, 3}}};
  for (int i = 0; i < 12; ++i) {
    model.push_back({"m" + std::to_string(i), {1}});
    file.push_back({"module.u" + std::to_string(i), {1}});
  }
  const auto mismatch = train::compare_keys(model, file);
  EXPECT_EQ(mismatch.missing.size(), 12u);
  EXPECT_EQ(mismatch.unexpected.size(), 12u);
  ASSERT_EQ(mismatch.shapes.size(), 1u);
  EXPECT_EQ(mismatch.shapes[0].key, "b");
  const std::string text = train::describe(mismatch);
  EXPECT_NE(text.find("12 missing key(s): m0, m1"), std::string::npos) << text;
  EXPECT_NE(text.find("m9, ... (2 more)"), std::string::npos) << text;
  EXPECT_EQ(text.find("m10"), std::string::npos) << text;
  EXPECT_NE(text.find("12 unexpected key(s): u0"), std::string::npos) << text;
  EXPECT_NE(text.find("1 key(s) of another shape: b (model [3, 4], file [4, 3])"),
            std::string::npos)
      << text;
  EXPECT_TRUE(train::compare_keys({{"module.x", {1}}}, {{"x", {1}}}).empty());
}

TEST(StateDict, OrderAndNamesArePythons) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  std::vector<std::string> keys;
  for (const auto& [key, tensor] : train::state_dict(*net, "module.")) keys.push_back(key);
  // Python: nn.DataParallel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))).state_dict().keys()
  EXPECT_EQ(keys,
            (std::vector<std::string>{"module.0.weight", "module.0.bias", "module.1.weight",
                                      "module.1.bias", "module.1.running_mean",
                                      "module.1.running_var", "module.1.num_batches_tracked"}));
}

TEST(StateDict, SavedWeightsLoadWithOrWithoutThePrefixIntoTheSameTensors) {
  TempDir dir;
  torch::manual_seed(1);
  auto source = ddp::models::make_mlp(784, 10);
  torch::manual_seed(2);
  auto target = ddp::models::make_mlp(784, 10);
  const auto first_weight = target->parameters()[0];
  for (const std::string prefix : {"module.", ""}) {
    target->parameters()[0].data().zero_();
    train::save_weights(*source, dir.file("w.pt"), prefix);
    train::load_weights(*target, dir.file("w.pt"));
    for (size_t i = 0; i < source->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(source->parameters()[i], target->parameters()[i])) << prefix;
    }
  }
  // In place: an optimizer holding the old tensors sees the new values.
  EXPECT_TRUE(target->parameters()[0].is_same(first_weight));

  const std::string error = input_error_of([&] {
    auto other = ddp::models::make_linear(5, 2);
    train::load_weights(*other, dir.file("w.pt"));
  });
  EXPECT_NE(error.find(dir.file("w.pt") + ": the weights do not fit the model: 2 missing key(s): "
                                          "0.weight, 0.bias; 6 unexpected key(s): 1.weight"),
            std::string::npos)
      << error;
}

TEST(StateDict, ACheckpointIsAlsoAWeightsFile) {
  TempDir dir;
  torch::manual_seed(3);
  auto net = ddp::models::make_linear(5, 2);
  train::Checkpoint c;
  c.model = train::state_dict(*net, train::kModulePrefix);
  c.optimizer = "sgd";
  c.batch_size = 4;
  c.optimizer_state = torch::zeros({3}, torch::kByte);
  c.rng_state = torch::zeros({1, 8}, torch::kByte);
  train::write_pt_file(dir.file("c.pt"), train::to_ivalue(c));
  auto other = ddp::models::make_linear(5, 2);
  train::load_weights(*other, dir.file("c.pt"));
  EXPECT_TRUE(torch::equal(other->parameters()[0], net->parameters()[0]));
}

TEST(PythonInterop, PythonLoadsOurWeightsStrictlyIntoDataParallelWithEqualOutputs) {
  TempDir dir;
  torch::manual_seed(5);
  auto net = ddp::models::make_mlp(784, 10);
  net->eval();
  train::save_weights(*net, dir.file("model.pt"));
  write_batch(dir, net);
  auto r = ddp::testing::run_process({DDP_PYTHON, python_script(), "check-ours", dir.path()}, {},
                                     std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'module.1.weight'"), std::string::npos) << r.output;
}

TEST(PythonInterop, PythonsTorchLoadReadsOurCheckpointWithItsDefaultAndWeightsOnly) {
  TempDir dir;
  torch::manual_seed(6);
  auto net = ddp::models::make_mlp(784, 10);
  net->eval();
  train::Checkpoint c;
  c.epoch = 3;
  c.model = train::state_dict(*net, train::kModulePrefix);
  c.optimizer = "sgd";
  c.config = "model: mlp\n";
  c.optimizer_state = torch::zeros({3}, torch::kByte);
  c.rng_state = torch::zeros({1, 8}, torch::kByte);
  c.grad_scaler = ddp::amp::GradScalerState{};  // --amp fp16's
  c.grad_scaler->scale = 1024;
  c.grad_scaler->growth_tracker = 5;
  train::write_pt_file(dir.file("checkpoint.pt"), train::to_ivalue(c));
  write_batch(dir, net);
  auto r = ddp::testing::run_process({DDP_PYTHON, python_script(), "check-checkpoint", dir.path()},
                                     {}, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch 3; max abs diffs"), std::string::npos) << r.output;
  // PyTorch's GradScaler.state_dict(), the floats read back from their tensors.
  EXPECT_NE(r.output.find("grad_scaler [('_growth_tracker', 'int', 5), ('backoff_factor', "
                          "'float', 0.5), ('growth_factor', 'float', 2.0), ('growth_interval', "
                          "'int', 2000), ('scale', 'float', 1024.0)]"),
            std::string::npos)
      << r.output;
}

TEST(PythonInterop, WeightsPythonSavedLoadIntoOurModelWithEqualOutputs) {
  TempDir dir;
  auto r = ddp::testing::run_process({DDP_PYTHON, python_script(), "save-python", dir.path()}, {},
                                     std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto batch = train::read_pt_file(dir.file("batch.pt")).toGenericDict();
  const auto input = batch.at("input").toTensor();
  const auto expected = batch.at("output").toTensor();
  for (const char* file : {"plain.pt", "prefixed.pt", "ordered.pt", "cuda.pt"}) {
    auto net = ddp::models::make_mlp(784, 10);
    train::load_weights(*net, dir.file(file));
    net->eval();
    const double diff = (net->forward(input) - expected).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << file;
  }
}

TEST(CheckpointFile, RoundTripsAndNamesWhatIsMissing) {
  train::Checkpoint c;
  c.epoch = 2;
  c.step = 64;
  c.world_size = 2;
  c.batch_size = 32;
  c.seed = 9;
  c.optimizer = "adam";
  c.config = "epochs: 4\n";
  c.model = {{"module.w", torch::ones({2})}};
  c.optimizer_state = torch::tensor({1, 2, 3}, torch::kByte);
  c.rng_state = torch::ones({2, 5}, torch::kByte);
  const auto back = train::checkpoint_from(
      train::parse_pt(train::serialize_pt(train::to_ivalue(c)), "c.pt"), "c.pt");
  EXPECT_EQ(back.epoch, 2);
  EXPECT_EQ(back.step, 64);
  EXPECT_EQ(back.world_size, 2);
  EXPECT_EQ(back.batch_size, 32);
  EXPECT_EQ(back.seed, 9);
  EXPECT_EQ(back.optimizer, "adam");
  EXPECT_EQ(back.config, "epochs: 4\n");
  EXPECT_TRUE(torch::equal(back.optimizer_state, c.optimizer_state));
  EXPECT_TRUE(torch::equal(back.rng_state, c.rng_state));
  EXPECT_EQ(back.epoch_step, 0);   // an epoch-end checkpoint has none stored
  EXPECT_FALSE(back.grad_scaler);  // nor one without --amp fp16 a GradScaler state

  c.grad_scaler = ddp::amp::GradScalerState{};
  c.grad_scaler->scale = 0.125;
  c.grad_scaler->growth_tracker = 11;
  const auto scaled = train::checkpoint_from(
      train::parse_pt(train::serialize_pt(train::to_ivalue(c)), "c.pt"), "c.pt");
  ASSERT_TRUE(scaled.grad_scaler);
  EXPECT_EQ(scaled.grad_scaler->scale, 0.125);
  EXPECT_EQ(scaled.grad_scaler->growth_tracker, 11);
  EXPECT_EQ(scaled.grad_scaler->growth_interval, 2000);
  c.grad_scaler.reset();

  // A sharded run's optimizer tensors, kept apart from optimizer_state.
  c.optimizer_tensors = {{"0.exp_avg", torch::full({2}, 0.5)}};
  const auto apart = train::checkpoint_from(
      train::parse_pt(train::serialize_pt(train::to_ivalue(c)), "c.pt"), "c.pt");
  ASSERT_EQ(apart.optimizer_tensors.size(), 1u);
  EXPECT_EQ(apart.optimizer_tensors[0].first, "0.exp_avg");
  EXPECT_TRUE(torch::equal(apart.optimizer_tensors[0].second, torch::full({2}, 0.5)));
  EXPECT_TRUE(back.optimizer_tensors.empty());  // none in a DDP run's
  c.optimizer_tensors.clear();

  c.epoch_step = 17;  // one written on SIGTERM, 17 steps into epoch 3
  EXPECT_EQ(train::checkpoint_from(
                train::parse_pt(train::serialize_pt(train::to_ivalue(c)), "c.pt"), "c.pt")
                .epoch_step,
            17);

  auto weights_only = train::to_ivalue(c.model);
  EXPECT_NE(input_error_of([&] {
              train::checkpoint_from(weights_only, "w.pt");
            }).find("w.pt: not a complete checkpoint: key 'format' is missing"),
            std::string::npos);
}

TEST(CheckpointFile, NamesSortAndPruneByEpoch) {
  using P = train::CheckpointPosition;
  EXPECT_EQ(train::checkpoint_file_name({3, 0}), "checkpoint-epoch-0003.pt");
  EXPECT_EQ(train::checkpoint_file_name({3, 42}), "checkpoint-epoch-0003-step-000042.pt");
  EXPECT_EQ(train::checkpoint_file_position("checkpoint-epoch-0003.pt"), (P{3, 0}));
  EXPECT_EQ(train::checkpoint_file_position("checkpoint-epoch-12345.pt"), (P{12345, 0}));
  EXPECT_EQ(train::checkpoint_file_position("checkpoint-epoch-0003-step-000042.pt"), (P{3, 42}));
  EXPECT_FALSE(train::checkpoint_file_position("checkpoint.pt"));
  EXPECT_FALSE(train::checkpoint_file_position("checkpoint-epoch-0003.pt.tmp-12"));
  EXPECT_FALSE(train::checkpoint_file_position("checkpoint-epoch-x.pt"));
  EXPECT_FALSE(train::checkpoint_file_position("checkpoint-epoch-0003-step-.pt"));
  EXPECT_FALSE(train::checkpoint_file_position("checkpoint-epoch-0003-step-4x.pt"));

  TempDir dir;
  for (P p : {P{9, 0}, P{10, 0}, P{2, 0}, P{1, 0}, P{9, 7}})
    ddp::testing::write_file(dir.file(train::checkpoint_file_name(p)), "x");
  ddp::testing::write_file(dir.file("checkpoint.pt"), "x");
  const auto newest = train::list_checkpoints(dir.path());
  ASSERT_EQ(newest.size(), 5u);
  EXPECT_EQ(newest[0], dir.file("checkpoint-epoch-0010.pt"));
  EXPECT_EQ(newest[1], dir.file("checkpoint-epoch-0009-step-000007.pt"));  // 7 steps into 10
  EXPECT_EQ(newest[2], dir.file("checkpoint-epoch-0009.pt"));
  EXPECT_EQ(newest[4], dir.file("checkpoint-epoch-0001.pt"));
  EXPECT_EQ(train::stale_checkpoints(newest, 3), (std::vector<std::string>{newest[3], newest[4]}));
  EXPECT_TRUE(train::stale_checkpoints(newest, 5).empty());
}

TEST(CheckpointResume, ANewWorldSizeKeepsTheGlobalBatchWhenItDivides) {
  EXPECT_EQ(train::batch_size_for_world(32, 2, 1), 64);
  EXPECT_EQ(train::batch_size_for_world(32, 2, 4), 16);
  EXPECT_EQ(train::batch_size_for_world(32, 2, 2), 32);
  EXPECT_FALSE(train::batch_size_for_world(32, 2, 3));
  EXPECT_FALSE(train::batch_size_for_world(1, 1, 2));
}

TEST(CheckpointResume, ChangedSettingsAreListedExceptTheIgnoredOnes) {
  const auto changes = train::changed_settings("lr: 0.1\nepochs: 2\nseed: 0\n",
                                               "lr: 0.2\nepochs: 4\nseed: 0\nnew: 1\n", {"epochs"});
  EXPECT_EQ(changes, (std::vector<std::string>{"lr: 0.1 -> 0.2", "new: (unset) -> 1"}));
}

TEST(CheckpointResume, MetricsKeepTheEpochsUpToTheCheckpoint) {
  const std::string lines =
      "{\"epoch\": 1, \"steps\": 3}\n{\"epoch\": 2, \"steps\": 6}\n{\"epoch\": 3, \"steps\": 9}\n";
  EXPECT_EQ(train::metrics_up_to(lines, 2),
            "{\"epoch\": 1, \"steps\": 3}\n{\"epoch\": 2, \"steps\": 6}\n");
  EXPECT_EQ(train::metrics_up_to(lines, 0), "");
  EXPECT_EQ(train::metrics_up_to("garbage\n{\"epoch\": 1}", 5), "{\"epoch\": 1}\n");
}

// samples.jsonl after a resume at step 2 (or a heal there): its steps up to 2, the torn last line
// of a rank 0 killed while writing it dropped.
TEST(CheckpointResume, SampleRecordsKeepTheStepsUpToTheCheckpoint) {
  const std::string lines =
      "{\"epoch\":1,\"step\":1,\"ids\":[[3],[1]]}\n{\"epoch\":1,\"step\":2,\"ids\":[[0],[2]]}\n"
      "{\"epoch\":2,\"step\":3,\"ids\":[[2],[0]]}\n{\"epoch\":2,\"st";
  EXPECT_EQ(
      train::records_up_to(lines, "step", 2),
      "{\"epoch\":1,\"step\":1,\"ids\":[[3],[1]]}\n{\"epoch\":1,\"step\":2,\"ids\":[[0],[2]]}\n");
  EXPECT_EQ(train::records_up_to(lines, "step", 9), lines.substr(0, lines.rfind('\n') + 1));
}

TEST(AtomicWrite, ReplacesTheFileAndLeavesNoTempFiles) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  ddp::testing::write_file(path + ".tmp-999999", "left by a killed writer");
  ddp::write_file_atomically(path, "one");
  ddp::write_file_atomically(path, "two");
  EXPECT_EQ(ddp::testing::read_file(path), "two");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"f.bin"});

  ddp::link_atomically(path, dir.file("latest.bin"));
  EXPECT_EQ(ddp::testing::read_file(dir.file("latest.bin")), "two");
  ddp::write_file_atomically(path, "three");  // a new file: the link keeps the old contents
  EXPECT_EQ(ddp::testing::read_file(dir.file("latest.bin")), "two");

  try {
    ddp::write_file_atomically(dir.file("missing/f.bin"), "x");
    ADD_FAILURE() << "no error";
  } catch (const ddp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing/f.bin")), std::string::npos) << e.what();
  }
}

// ddp::read_file reads a file whole: one of a known size in one read, and /proc's, whose size
// reads 0 and which cannot seek to their end (the launcher reads a worker's status there).
TEST(ReadFile, ReadsFilesOfAKnownSizeAndProcsFiles) {
  TempDir dir;
  std::string bytes(300000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + i / 7);
  ddp::testing::write_file(dir.file("f.bin"), bytes);
  EXPECT_EQ(ddp::read_file(dir.file("f.bin")), bytes);
  ddp::testing::write_file(dir.file("empty"), "");
  EXPECT_EQ(ddp::read_file(dir.file("empty")), "");
  const std::string status = ddp::read_file("/proc/self/status");
  EXPECT_NE(status.find("\nPid:\t" + std::to_string(::getpid()) + "\n"), std::string::npos)
      << status;
  EXPECT_NE(input_error_of([&] { ddp::read_file(dir.file("missing")); })
                .find(dir.file("missing") + ": cannot open"),
            std::string::npos);
}

TEST(AtomicWrite, AnUnwritableDirectoryIsAnInputError) {
  // /sys refuses new files even to root (who ignores permission bits).
  EXPECT_NE(input_error_of([] {
              ddp::check_writable_dir("/sys/kernel");
            }).find("output dir '/sys/kernel': not writable"),
            std::string::npos);
  TempDir dir;
  ddp::check_writable_dir(dir.path());
}

}  // namespace
