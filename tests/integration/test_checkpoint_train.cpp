// ddp_train's checkpoints with real processes: exact resume on 2 ranks, a kill -9 in the middle
// of a save, and each kind of bad input (exit code 2 and a message naming the file).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>
#include <thread>

#include "built_paths.h"
#include "ddp/core/autocast.h"
#include "ddp/train/checkpoint.h"
#include "ddp/train/pt_file.h"
#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

namespace fs = std::filesystem;
using ddp::testing::expect_same_weights;
using ddp::testing::ProcessResult;
using ddp::testing::TempDir;
using std::chrono::seconds;

// ddp_train with configs/`config`, `epochs` epochs into `out`, then `extra`.
std::vector<std::string> train_job(const char* config, const std::string& out, int epochs,
                                   std::vector<std::string> extra) {
  std::vector<std::string> argv = {DDP_TRAIN_BIN,
                                   "--config",
                                   std::string(DDP_SOURCE_DIR) + "/configs/" + config,
                                   "--epochs",
                                   std::to_string(epochs),
                                   "--output-dir",
                                   out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// A short Fashion-MNIST MLP run (SGD with momentum, so the optimizer state matters).
std::vector<std::string> mlp_job(const std::string& out, int epochs,
                                 std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(),
               {"--data", DDP_FASHION_MNIST_DIR, "--train-subset", "1200", "--test-subset",
                ddp::testing::kTestSubset, "--batch-size", "32"});
  return train_job("fashion_mnist_mlp.yaml", out, epochs, std::move(extra));
}

// The tutorial's Linear demo: the quickest run there is.
std::vector<std::string> linear_job(const std::string& out, int epochs,
                                    std::vector<std::string> extra = {}) {
  return train_job("random_linear.yaml", out, epochs, std::move(extra));
}

void expect_all_ok(const std::vector<ProcessResult>& ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
  }
}

ProcessResult run(const std::vector<std::string>& argv) {
  return ddp::testing::run_process(argv, {}, seconds(120));
}

// A bad-input failure: exit code 2, one clear line, no crash.
void expect_input_error(const ProcessResult& r, const std::string& expected) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << "expected '" << expected << "' in\n"
                                                        << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Exception raised from"), std::string::npos) << r.output;
}

// The metrics lines without the timing fields, which differ from run to run (and without
// grad_bytes_per_step, after them in the line, which this comparison has always left out): the
// straggler attribution's figures and verdict are timings too.
std::vector<std::string> metrics_without_timing(const std::string& dir) {
  std::istringstream in(ddp::testing::read_file(dir + "/metrics.jsonl"));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    auto record = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) {
      ADD_FAILURE() << dir << "/metrics.jsonl: not a JSON object: " << line;
      continue;
    }
    for (const char* key :
         {"samples_per_s", "epoch_seconds", "grad_bytes_per_step", "rank_step_ms", "straggler"}) {
      record.erase(key);
    }
    out.push_back(record.dump());
  }
  return out;
}

// `world` ranks train the MLP with `options` for 2 epochs into `split`, then resume there to 4:
// the weights and the metrics equal those of the uninterrupted 4-epoch run in `whole`, bitwise.
void expect_resume_equals_whole(int world, const std::vector<std::string>& options,
                                const TempDir& whole, const TempDir& split) {
  expect_all_ok(
      ddp::testing::run_env_ranks(world, mlp_job(split.path(), 2, options), seconds(180)));
  auto more = options;
  more.insert(more.end(), {"--resume", "auto"});
  expect_all_ok(ddp::testing::run_env_ranks(world, mlp_job(split.path(), 4, more), seconds(180)));
  expect_same_weights(whole.file("model.pt"), split.file("model.pt"));
  EXPECT_EQ(metrics_without_timing(split.path()), metrics_without_timing(whole.path()));
}

TEST(CheckpointTrain, ResumingOnTwoRanksEqualsAnUninterruptedRunBitwise) {
  TempDir whole, split, from_path;
  expect_all_ok(ddp::testing::run_env_ranks(2, mlp_job(whole.path(), 4), seconds(180)));
  expect_all_ok(ddp::testing::run_env_ranks(2, mlp_job(split.path(), 2), seconds(180)));
  auto resumed =
      ddp::testing::run_env_ranks(2, mlp_job(split.path(), 4, {"--resume", "auto"}), seconds(180));
  expect_all_ok(resumed);
  EXPECT_NE(resumed[0].output.find("resumed from " + split.file("checkpoint-epoch-0002.pt")),
            std::string::npos)
      << resumed[0].output;
  expect_same_weights(whole.file("model.pt"), split.file("model.pt"));
  EXPECT_EQ(metrics_without_timing(split.path()), metrics_without_timing(whole.path()));
  EXPECT_EQ(metrics_without_timing(whole.path()).size(), 4u);

  // --resume PATH, into another output dir.
  expect_all_ok(ddp::testing::run_env_ranks(
      2, mlp_job(from_path.path(), 4, {"--resume", whole.file("checkpoint-epoch-0002.pt")}),
      seconds(180)));
  expect_same_weights(whole.file("model.pt"), from_path.file("model.pt"));
}

// --zero (ZeRO-1) with Adam on 3 ranks: trains as plain Adam does (to 1e-5; the shards' updates
// are element-wise), its checkpoint holds one optimizer shard per rank, and resuming it equals the
// uninterrupted run bitwise. On 2 ranks (global batch kept: 48 each), its shards are resharded and
// the run ends where the 3-rank one ends (to 1e-5: the ranks' partial sums differ). A --zero
// checkpoint refuses a run without --zero.
TEST(CheckpointTrain, ZeroOnThreeRanksTrainsAsAdamAndResumesBitwise) {
  TempDir plain, whole, split;
  const std::vector<std::string> adam = {"--optimizer", "adam", "--lr", "0.001"};
  auto zero = adam;
  zero.push_back("--zero");
  expect_all_ok(ddp::testing::run_env_ranks(3, mlp_job(plain.path(), 4, adam), seconds(180)));
  expect_all_ok(ddp::testing::run_env_ranks(3, mlp_job(whole.path(), 4, zero), seconds(180)));
  const auto wp =
      ddp::train::state_dict_from(ddp::train::read_pt_file(plain.file("model.pt")), "p");
  const auto wz =
      ddp::train::state_dict_from(ddp::train::read_pt_file(whole.file("model.pt")), "z");
  ASSERT_EQ(wp.size(), wz.size());
  for (size_t i = 0; i < wp.size(); ++i) {
    EXPECT_TRUE(torch::allclose(wz[i].second, wp[i].second, 1e-5, 1e-6)) << wp[i].first;
  }
  const auto c = ddp::train::read_checkpoint(whole.file("checkpoint.pt"));
  EXPECT_EQ(c.optimizer_shards.size(), 3u);
  EXPECT_EQ(c.optimizer_state.numel(), 0);

  expect_resume_equals_whole(3, zero, whole, split);

  const auto checkpoint = whole.file("checkpoint-epoch-0002.pt");
  TempDir elsewhere;
  auto unsharded = adam;
  unsharded.insert(unsharded.end(), {"--resume", checkpoint});
  auto r = ddp::testing::run_env_ranks(3, mlp_job(elsewhere.path(), 4, unsharded), seconds(180));
  expect_input_error(r[0], checkpoint + ": saved with --zero; resume with it");
  auto other_world = zero;
  other_world.insert(other_world.end(), {"--resume", checkpoint});
  r = ddp::testing::run_env_ranks(2, mlp_job(elsewhere.path(), 4, other_world), seconds(180));
  expect_all_ok(r);
  EXPECT_NE(r[0].output.find(checkpoint +
                             ": the optimizer state of 3 ranks' shards resharded over 2 ranks"),
            std::string::npos)
      << r[0].output;
  const auto w2 =
      ddp::train::state_dict_from(ddp::train::read_pt_file(elsewhere.file("model.pt")), "2");
  ASSERT_EQ(w2.size(), wz.size());
  for (size_t i = 0; i < wz.size(); ++i) {
    EXPECT_TRUE(torch::allclose(w2[i].second, wz[i].second, 1e-5, 1e-6)) << wz[i].first;
  }
}

// --amp fp16 on CPU where LibTorch's kernels have float16 matmuls (2.x): the checkpoint holds the
// GradScaler's state, and resuming equals the uninterrupted run bitwise, scale included. Where
// they have not (1.13), the run stops at start-up with an error naming the key and the reason.
TEST(CheckpointTrain, AmpFp16KeepsItsGradScalerAndResumesBitwise) {
  const std::vector<std::string> fp16 = {"--amp", "fp16"};
  const std::string unsupported = ddp::amp::autocast_unsupported(torch::kCPU, torch::kHalf);
  if (!unsupported.empty()) {
    TempDir out;
    expect_input_error(run(linear_job(out.path(), 1, fp16)),
                       "cannot run fp16 autocast on cpu (" + unsupported + ")");
    return;
  }
  TempDir whole, split;
  auto first = ddp::testing::run_env_ranks(2, mlp_job(whole.path(), 4, fp16), seconds(180));
  expect_all_ok(first);
  EXPECT_NE(first[0].output.find("mixed precision: fp16 autocast on cpu, the loss scaled by a "
                                 "GradScaler from 65536"),
            std::string::npos)
      << first[0].output;
  expect_resume_equals_whole(2, fp16, whole, split);
  const auto a = ddp::train::read_checkpoint(whole.file("checkpoint.pt"));
  const auto b = ddp::train::read_checkpoint(split.file("checkpoint.pt"));
  ASSERT_TRUE(a.grad_scaler && b.grad_scaler);
  EXPECT_EQ(a.grad_scaler->scale, b.grad_scaler->scale);
  EXPECT_EQ(a.grad_scaler->growth_tracker, b.grad_scaler->growth_tracker);
  // Each step either grew the tracker or reset it with a skip: never more than the steps.
  EXPECT_LE(a.grad_scaler->growth_tracker, a.step);
}

// The Informer draws random numbers in training (dropout, ProbSparse's key sample) and in
// evaluation (the sample). The checkpoint after epoch 1 of a 1-epoch run, which evaluated the test
// split too, resumes into exactly the uninterrupted run, which did not.
TEST(CheckpointTrain, InformerResumesBitwiseThoughEvaluationsDiffered) {
  TempDir whole, split, data;
  const std::string series = ddp::testing::write_short_series(data.file("ts.csv"));
  auto informer_job = [&](const std::string& out, int epochs, std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--data", series, "--train-subset", "640", "--threads", "1"});
    return train_job("informer_csv.yaml", out, epochs, std::move(extra));
  };
  expect_all_ok(ddp::testing::run_env_ranks(2, informer_job(whole.path(), 2, {}), seconds(180)));
  expect_all_ok(ddp::testing::run_env_ranks(2, informer_job(split.path(), 1, {}), seconds(180)));
  expect_all_ok(ddp::testing::run_env_ranks(2, informer_job(split.path(), 2, {"--resume", "auto"}),
                                            seconds(180)));
  expect_same_weights(whole.file("model.pt"), split.file("model.pt"));
  EXPECT_EQ(metrics_without_timing(split.path()).back(),
            metrics_without_timing(whole.path()).back());
}

TEST(CheckpointTrain, AKillDuringASaveLeavesThePreviousCheckpointLoadable) {
  TempDir out;
  // Each 64 KiB of an atomic write takes 30 ms more (tests/support/slow_writes.c, preloaded): a
  // save of the 2.1 MB MLP takes about 2 s.
  ddp::testing::Child child(mlp_job(out.path(), 3),
                            {{"LD_PRELOAD", DDP_SLOW_WRITES_LIB}, {"DDP_SLOW_WRITES_MS", "30"}});
  const auto deadline = std::chrono::steady_clock::now() + seconds(90);
  bool saving_second = false;
  while (!saving_second && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out.path(), ec)) {
      if (e.path().filename().string().rfind("checkpoint-epoch-0002.pt.tmp-", 0) == 0) {
        saving_second = true;
      }
    }
  }
  ASSERT_TRUE(saving_second) << "the second save never started";
  child.kill_group();  // SIGKILL in the middle of writing checkpoint-epoch-0002.pt

  EXPECT_FALSE(fs::exists(out.file("checkpoint-epoch-0002.pt")));
  EXPECT_EQ(ddp::train::read_checkpoint(out.file("checkpoint.pt")).epoch, 1);
  auto resumed = run(mlp_job(out.path(), 3, {"--resume", "auto"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + out.file("checkpoint-epoch-0001.pt")),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(ddp::train::read_checkpoint(out.file("checkpoint.pt")).epoch, 3);
  for (const auto& e : fs::directory_iterator(out.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST(CheckpointTrain, TruncatedOrCorruptCheckpointsAreInputErrors) {
  TempDir out;
  ASSERT_EQ(run(linear_job(out.path(), 2)).exit_code, 0);
  const std::string good = ddp::testing::read_file(out.file("checkpoint.pt"));
  ddp::testing::write_file(out.file("truncated.pt"), good.substr(0, good.size() / 2));
  std::string corrupt = good;
  for (size_t i = 100; i < 300; ++i) corrupt[i] = 'x';  // the start of the pickle
  ddp::testing::write_file(out.file("corrupt.pt"), corrupt);
  for (const char* bad : {"truncated.pt", "corrupt.pt"}) {
    expect_input_error(run(linear_job(out.path(), 3, {"--resume", out.file(bad)})),
                       out.file(bad) + ": ");
  }
  expect_input_error(run(linear_job(out.path(), 3, {"--resume", out.file("none.pt")})),
                     out.file("none.pt") + ": cannot open");
}

TEST(CheckpointTrain, ResumeAutoSkipsACorruptNewestCheckpoint) {
  TempDir out;
  ASSERT_EQ(run(linear_job(out.path(), 2)).exit_code, 0);
  const std::string newest = out.file("checkpoint-epoch-0002.pt");
  const std::string good = ddp::testing::read_file(newest);
  ddp::testing::write_file(newest, good.substr(0, good.size() - 10));
  auto r = run(linear_job(out.path(), 3, {"--resume", "auto"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[warning] --resume auto: skipping " + newest), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resumed from " + out.file("checkpoint-epoch-0001.pt")),
            std::string::npos)
      << r.output;
}

TEST(CheckpointTrain, AnotherModelsCheckpointListsTheKeysThatDiffer) {
  TempDir linear, mlp;
  ASSERT_EQ(run(linear_job(linear.path(), 1)).exit_code, 0);
  auto r = run(mlp_job(mlp.path(), 1, {"--resume", linear.file("checkpoint.pt")}));
  expect_input_error(r, linear.file("checkpoint.pt") +
                            ": the weights do not fit the model: 6 missing key(s): 1.weight, "
                            "1.bias, 3.weight, 3.bias, 5.weight, 5.bias; 2 unexpected key(s): "
                            "0.weight, 0.bias");
  expect_input_error(run(mlp_job(mlp.path(), 1, {"--init-weights", linear.file("model.pt")})),
                     linear.file("model.pt") + ": the weights do not fit the model");
}

TEST(CheckpointTrain, ANewWorldSizeKeepsTheGlobalBatchOrIsRefused) {
  TempDir out;
  expect_all_ok(ddp::testing::run_env_ranks(2, linear_job(out.path(), 1, {"--batch-size", "15"}),
                                            seconds(120)));
  auto one = run(linear_job(out.path(), 2, {"--resume", "auto"}));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("saved by 2 ranks, resumed on 1: batch size per rank 15 -> 30 keeps "
                            "the global batch 30"),
            std::string::npos)
      << one.output;
  EXPECT_NE(one.output.find("batch 30 per rank (30 global)"), std::string::npos) << one.output;

  auto four = ddp::testing::run_env_ranks(
      4,
      linear_job(out.path(), 3,
                 {"--global-batch-size", "0", "--resume", out.file("checkpoint-epoch-0001.pt")}),
      seconds(120));
  for (const auto& rank : four) {
    expect_input_error(rank,
                       "saved by 2 ranks with batch size 15 (global batch 30), which 4 "
                       "ranks cannot share evenly");
  }
}

TEST(CheckpointTrain, UnwritableOutputDirAndMissingWeightsAreInputErrors) {
  // /sys refuses new files even to root, who ignores permission bits.
  expect_input_error(run(linear_job("/sys/kernel", 1)), "output dir '/sys/kernel': not writable");
  TempDir out;
  expect_input_error(run(linear_job(out.path(), 1, {"--init-weights", out.file("no.pt")})),
                     out.file("no.pt") + ": cannot open");
}

TEST(CheckpointTrain, SavePrefixNoneWritesTheModelsOwnNames) {
  TempDir out;
  ASSERT_EQ(
      run(linear_job(out.path(), 1, {"--save-prefix", "none", "--save-every", "0"})).exit_code, 0);
  const auto weights = ddp::train::state_dict_from(ddp::train::read_pt_file(out.file("model.pt")),
                                                   out.file("model.pt"));
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_EQ(weights[0].first, "0.weight");
  EXPECT_EQ(weights[1].first, "0.bias");
  // The checkpoint keeps DataParallel's names whatever model.pt uses.
  EXPECT_EQ(ddp::train::read_checkpoint(out.file("checkpoint.pt")).model[0].first,
            "module.0.weight");
}

// Checkpoints that main at 9ae8ad7 wrote (tests/fixtures/checkpoints-9ae8ad7: each kind after one
// epoch of the Linear demo on 2 ranks, and that commit's model.pt after a resume to epoch 2): the
// same resume now ends with the same weights: bitwise on the kind of CPU that wrote them; on
// another, LibTorch's and the BLAS's kernels round differently (on an AMD EPYC of family 26, 2.1
// GHz, the resume with Adam or ZeRO ended 1.5e-8 to 6e-8 away, main at 9ae8ad7's own build too),
// so within 1e-6. A resume that lost or misread the optimizer's state lands 1e-3 away or more (a
// step of lr 0.01 taken without its moments).
struct Fixture {
  std::string kind;        // the folder
  std::string checkpoint;  // in it
  std::vector<std::string> options;
};

class Fixtures9ae8ad7 : public ::testing::TestWithParam<Fixture> {};

TEST_P(Fixtures9ae8ad7, ResumeAndTrainAsThatCommitDid) {
  const Fixture& f = GetParam();
  const std::string dir =
      std::string(DDP_SOURCE_DIR) + "/tests/fixtures/checkpoints-9ae8ad7/" + f.kind + "/";
  TempDir out;
  std::vector<std::string> extra = {"--device", "cpu",      "--progress",
                                    "off",      "--resume", dir + f.checkpoint};
  extra.insert(extra.end(), f.options.begin(), f.options.end());
  expect_all_ok(ddp::testing::run_env_ranks(2, linear_job(out.path(), 2, extra), seconds(120)));
  expect_close_weights(out.file("model.pt"), dir + "model-after-epoch-2.pt", 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Fixtures9ae8ad7,
    ::testing::Values(
        Fixture{"gathered",
                "checkpoint-epoch-0001.pt",
                {"--fsdp", "--optimizer", "adam", "--lr", "0.01"}},
        Fixture{"sharded",
                "checkpoint-epoch-0001.shards",
                {"--fsdp", "--checkpoint-sharded", "--optimizer", "adam", "--lr", "0.01"}},
        Fixture{"zero", "checkpoint-epoch-0001.pt", {"--zero"}},
        Fixture{"diloco", "checkpoint-epoch-0001.pt", {"--sync", "diloco", "--sync-every", "2"}}),
    [](const ::testing::TestParamInfo<Fixture>& info) { return info.param.kind; });

}  // namespace
