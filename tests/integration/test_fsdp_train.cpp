// ddp_train --fsdp: the built-in models sharded over real ranks train as one process with the
// whole batch, and as DDP on as many ranks; their checkpoints resume on as many ranks bitwise and
// on another number as DDP's do; the options FSDP cannot honour are refused by name.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>

#include "built_paths.h"
#include "ddp/core/autocast.h"
#include "ddp/train/checkpoint.h"
#include "ranks.h"
#include "run_files.h"
#include "subprocess.h"
#include "train_args.h"

namespace {

using ddp::testing::config;
using ddp::testing::expect_close_weights;
using ddp::testing::TempDir;
using std::chrono::seconds;

constexpr double kTolerance = 1e-5;

std::vector<std::string> train(const std::string& config_name, const std::string& out,
                               const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {DDP_TRAIN_BIN,  "--config", config(config_name.c_str()),
                                   "--output-dir", out,        "--progress",
                                   "off",          "--device", "cpu"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

void expect_ranks_ok(const std::vector<ddp::testing::ProcessResult>& ranks) {
  ddp::testing::expect_all_exit_zero(ranks);
}

std::string model_of(const TempDir& dir) {
  return dir.path() + "/model.pt";
}

// The MLP on 256 Fashion-MNIST samples, 2 epochs of Adam.
std::vector<std::string> mlp(int64_t batch, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--train-subset", "256",  "--test-subset", "256",
                                   "--epochs",       "2",    "--batch-size",  std::to_string(batch),
                                   "--optimizer",    "adam", "--lr",          "0.001"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(FsdpTrain, MlpOnTwoRanksEqualsOneProcessWithTwiceTheBatch) {
  TempDir one, two;
  expect_ranks_ok({ddp::testing::run_process(train("fashion_mnist_mlp.yaml", one.path(), mlp(32)),
                                             {}, seconds(120))});
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("fashion_mnist_mlp.yaml", two.path(), mlp(16, {"--fsdp"})), seconds(120)));
  expect_close_weights(model_of(two), model_of(one), kTolerance);
}

// The Informer on a short series. Against one process: without dropout, with ProbSparse's factor
// so large that every query attends (its random sample of keys then changes nothing: one process
// and two ranks draw different random numbers), one encoder layer (the distilling layers'
// BatchNorm normalizes each rank's batch, not the whole), and SGD (Adam's step divides by the
// gradient's running magnitude: on a parameter whose gradient is nearly zero, such as the key
// projection's bias, which softmax ignores, rounding in the sums moves it by up to the lr).
std::vector<std::string> informer(const std::string& data, int64_t batch,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--data", data,           "--train-subset",     "64", "--test-subset", "32", "--epochs",
      "1",      "--batch-size", std::to_string(batch)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(FsdpTrain, InformerOnTwoRanksEqualsOneProcessWithTwiceTheBatch) {
  TempDir one, two, data;
  const std::string csv = ddp::testing::write_short_series(data.path() + "/series.csv");
  const std::vector<std::string> exact = {
      "--dropout", "0", "--factor", "100", "--e-layers", "1", "--optimizer", "sgd", "--lr", "0.01"};
  expect_ranks_ok({ddp::testing::run_process(
      train("informer_csv.yaml", one.path(), informer(csv, 8, exact)), {}, seconds(180))});
  auto sharded = exact;
  sharded.push_back("--fsdp");
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("informer_csv.yaml", two.path(), informer(csv, 4, sharded)), seconds(180)));
  expect_close_weights(model_of(two), model_of(one), kTolerance);
}

// `args` and `extra` on 2 ranks (`mpirun`: under mpirun, or else env ranks), into `out`.
void run_two(const TempDir& out, const std::string& config_name, std::vector<std::string> args,
             const std::vector<std::string>& extra, bool mpirun = false) {
  auto argv = train(config_name, out.path(), std::move(args));
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!mpirun) return expect_ranks_ok(ddp::testing::run_env_ranks(2, argv, seconds(240)));
  const auto r = ddp::testing::run_mpirun(2, argv, seconds(240));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// `args` on 2 ranks with and without --fsdp (each side with its extra arguments), to the same
// weights.
void expect_fsdp_equals_ddp(const std::string& config_name, std::vector<std::string> args,
                            bool mpirun = false, double tolerance = kTolerance,
                            const std::vector<std::string>& ddp_extra = {},
                            const std::vector<std::string>& fsdp_extra = {"--fsdp"}) {
  TempDir ddp, fsdp;
  run_two(ddp, config_name, args, ddp_extra, mpirun);
  run_two(fsdp, config_name, args, fsdp_extra, mpirun);
  expect_close_weights(model_of(fsdp), model_of(ddp), tolerance);
}

TEST(FsdpTrain, ResNet18ByBlockEqualsDdp) {
  // BatchNorm's statistics: rank 0's broadcast before each forward in both (broadcast-buffers).
  expect_fsdp_equals_ddp("fashion_mnist_resnet18_cpu.yaml",
                         {"--train-subset", "16", "--test-subset", "8", "--batch-size", "4"});
}

TEST(FsdpTrain, ResNet18WithBuffersPerRankEqualsDdp) {
  expect_fsdp_equals_ddp("fashion_mnist_resnet18_cpu.yaml",
                         {"--train-subset", "16", "--test-subset", "8", "--batch-size", "4",
                          "--broadcast-buffers", "false"});
}

TEST(FsdpTrain, MlpWithClippingOnGlooEqualsDdp) {
  expect_fsdp_equals_ddp("fashion_mnist_mlp.yaml",
                         mlp(16, {"--backend", "gloo", "--clip-grad-norm", "0.05"}));
}

// Units kept gathered from their forward to their backward: more at once than the slots made for
// them, so most gather into memory of their own.
TEST(FsdpTrain, MlpWithUnitsKeptGatheredAfterTheirForwardEqualsDdp) {
  expect_fsdp_equals_ddp("fashion_mnist_mlp.yaml", mlp(16), false, kTolerance, {},
                         {"--fsdp", "--reshard-after-forward", "false"});
}

TEST(FsdpTrain, InformerWithDropoutEqualsDdp) {
  TempDir data;
  const std::string csv = ddp::testing::write_short_series(data.path() + "/series.csv");
  expect_fsdp_equals_ddp("informer_csv.yaml", informer(csv, 4));
}

TEST(FsdpTrain, LinearWithMicroBatchesUnderMpirunEqualsDdp) {
  expect_fsdp_equals_ddp(
      "random_linear.yaml",
      {"--epochs", "2", "--batch-size", "6", "--grad-accum-steps", "2", "--backend", "mpi"},
      /*mpirun=*/true);
}

// bf16 autocast: the forward's matmuls in bf16 in both, from the same float32 parameters; only
// the order of the gradients' float32 sums may differ.
TEST(FsdpTrain, MlpUnderBf16AutocastEqualsDdp) {
  expect_fsdp_equals_ddp("fashion_mnist_mlp.yaml", mlp(16, {"--amp", "bf16"}), false, kTolerance);
}

// The mixed precision policy: layers gathered and computed in bf16 from float32 shards. With
// float32 reduce-scatters it is autocast's arithmetic (each matmul in bf16 on bf16 copies of the
// weights, the gradients cast back to float32 before they are summed), so DDP under autocast.
TEST(FsdpTrain, MlpUnderABf16PolicyWithFloat32ReducesEqualsDdpUnderAutocast) {
  expect_fsdp_equals_ddp(
      "fashion_mnist_mlp.yaml", mlp(16), false, kTolerance, {"--amp", "bf16"},
      {"--fsdp", "--fsdp-param-dtype", "bfloat16", "--fsdp-reduce-dtype", "float32"});
}

// With bf16 reduce-scatters each averaged gradient is rounded to bf16 (8 bits of mantissa): after
// 32 SGD steps every tensor stays within 3 % of DDP's under autocast (measured: at most 1 %).
TEST(FsdpTrain, MlpUnderABf16PolicyStaysWithinBf16RoundingOfDdpUnderAutocast) {
  TempDir ddp, fsdp;
  const auto args = mlp(16, {"--optimizer", "sgd", "--lr", "0.05"});
  run_two(ddp, "fashion_mnist_mlp.yaml", args, {"--amp", "bf16"});
  run_two(fsdp, "fashion_mnist_mlp.yaml", args, {"--fsdp", "--fsdp-param-dtype", "bfloat16"});
  const auto a = ddp::train::state_dict_from(ddp::train::read_pt_file(model_of(ddp)), "ddp");
  const auto b = ddp::train::state_dict_from(ddp::train::read_pt_file(model_of(fsdp)), "fsdp");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double relative =
        ((a[i].second - b[i].second).norm() / a[i].second.norm()).item<double>();
    EXPECT_LE(relative, 0.03) << a[i].first;
    EXPECT_GT(relative, 0.0) << a[i].first << ": bf16 reduces round, so some difference shows";
  }
}

TEST(FsdpTrain, ABf16PolicyIsRefusedWithAutocastWithoutFsdpAndOnBatchNorm) {
  struct Case {
    std::string config;
    std::vector<std::string> extra;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"random_linear.yaml",
       {"--fsdp", "--fsdp-param-dtype", "bfloat16", "--amp", "bf16"},
       "key 'fsdp': cannot be combined with amp together with fsdp-param-dtype"},
      {"random_linear.yaml", {"--fsdp-reduce-dtype", "bfloat16"}, "need fsdp"},
      {"fashion_mnist_resnet18_cpu.yaml",
       {"--fsdp", "--fsdp-param-dtype", "bfloat16", "--train-subset", "8", "--test-subset", "8"},
       "(torch::nn::BatchNorm2d"}};
  for (const auto& c : cases) {
    TempDir out;
    const auto r = ddp::testing::run_process(train(c.config, out.path(), c.extra), {}, seconds(60));
    const std::string& expected = c.expected;
    EXPECT_NE(r.exit_code, 0) << expected;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

TEST(FsdpTrain, AResumeOnAsManyRanksIsBitwiseAndOnAnotherEqualsDdpsResume) {
  TempDir whole, split, one_fsdp, one_ddp;
  const auto two_ranks = [&](const TempDir& out, std::vector<std::string> extra) {
    extra.push_back("--fsdp");
    expect_ranks_ok(ddp::testing::run_env_ranks(
        2, train("fashion_mnist_mlp.yaml", out.path(), mlp(16, extra)), seconds(120)));
  };
  two_ranks(whole, {});
  // Python reads what rank 0 streamed unit by unit: model.pt into nn.DataParallel, the checkpoint
  // (Adam's moments kept apart, each shaped as its parameter).
  const auto python = ddp::testing::run_process(
      {DDP_PYTHON, std::string(DDP_SOURCE_DIR) + "/tests/python/checkpoint_interop.py",
       "check-gathered", whole.path()},
      {}, seconds(120));
  EXPECT_EQ(python.exit_code, 0) << python.output;
  EXPECT_NE(python.output.find("12 optimizer tensors"), std::string::npos) << python.output;
  two_ranks(split, {"--epochs", "1"});
  const std::string checkpoint = split.path() + "/checkpoint-epoch-0001.pt";
  two_ranks(split, {"--resume", "auto"});
  ddp::testing::expect_same_weights(model_of(split), model_of(whole));
  // Epoch 2 on one rank (batch 32, the global batch kept), from the sharded run's checkpoint:
  // sharded over one rank, and DDP's.
  for (const auto* out : {&one_fsdp, &one_ddp}) {
    std::vector<std::string> extra = {"--resume", checkpoint};
    if (out == &one_fsdp) extra.push_back("--fsdp");
    expect_ranks_ok({ddp::testing::run_process(
        train("fashion_mnist_mlp.yaml", out->path(), mlp(16, extra)), {}, seconds(120))});
  }
  expect_close_weights(model_of(one_fsdp), model_of(one_ddp), kTolerance);
  expect_close_weights(model_of(one_fsdp), model_of(whole), kTolerance);
}

// A SIGTERM to rank 1 after step 6 (the tests' ddp_fault_train): every rank stops after the same
// step, a checkpoint is written in the middle of the epoch (rank 0's, or with `mode`
// --checkpoint-sharded each rank's, settled before the exit), and the resume ends as the run that
// was never stopped.
void expect_a_signal_stop_to_resume_as_an_uninterrupted_run(const std::vector<std::string>& mode) {
  TempDir whole, stopped;
  const auto linear = [&](const TempDir& out, const std::string& program,
                          const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {
        DDP_LAUNCHER_BIN, "--nproc",  "2", program,        "--config", config("random_linear.yaml"),
        "--fsdp",         "--epochs", "2", "--output-dir", out.path()};
    argv.insert(argv.end(), mode.begin(), mode.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    return ddp::testing::run_process(argv, {}, seconds(120));
  };
  const auto reference = linear(whole, DDP_TRAIN_BIN, {});
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto r = linear(stopped, DDP_FAULT_TRAIN_BIN,
                        {"--checkpoint-on-signal", "--fault", "sigterm", "--fault-rank", "1",
                         "--fault-after-step", "6"});
  ASSERT_EQ(r.exit_code, 143) << r.output;
  EXPECT_NE(r.output.find("stopped by SIGTERM after step 6"), std::string::npos) << r.output;
  const auto resumed = linear(stopped, DDP_TRAIN_BIN, {"--resume", "auto"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ddp::testing::expect_same_weights(model_of(stopped), model_of(whole));
}

TEST(FsdpTrain, CheckpointOnSignalStopsEveryRankAndTheResumeEndsAsAnUninterruptedRun) {
  expect_a_signal_stop_to_resume_as_an_uninterrupted_run({});
}

TEST(FsdpTrain, CheckpointOnSignalWithShardedCheckpointsResumesAsAnUninterruptedRun) {
  expect_a_signal_stop_to_resume_as_an_uninterrupted_run({"--checkpoint-sharded"});
}

// A span of the timeline: its lane (0: the step; 1 + u: unit u), name, step and times (us).
struct Span {
  int lane = 0;
  std::string name;
  int64_t step = -1;
  double begin = 0, end = 0;
};

// Each rank's spans of the trace at `path`.
std::map<int, std::vector<Span>> spans_of(const std::string& path) {
  std::map<int, std::vector<Span>> ranks;
  const auto document = nlohmann::json::parse(ddp::testing::read_file(path));
  for (const auto& e : document.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    Span s{e.at("tid").get<int>(), e.at("name").get<std::string>(),
           e.at("args").value("step", int64_t{-1}), e.at("ts").get<double>(), 0.0};
    s.end = s.begin + e.at("dur").get<double>();
    ranks[e.at("pid").get<int>()].push_back(s);
  }
  return ranks;
}

// The span named `name` of unit lane `lane` in `step`: the first (forward's gather) or the
// second (backward's); nullptr when there is none.
const Span* find_span(const std::vector<Span>& spans, int lane, int64_t step,
                      const std::string& name, int nth = 0) {
  for (const auto& s : spans) {
    if (s.lane == lane && s.step == step && s.name == name && nth-- == 0) return &s;
  }
  return nullptr;
}

TEST(FsdpTrain, TheTimelineShowsEachGatherBegunBeforeThePreviousUnitsComputeEnds) {
  TempDir out;
  const std::string trace = out.path() + "/trace.json";
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("fashion_mnist_mlp.yaml", out.path(), mlp(16, {"--fsdp", "--timeline", trace})),
      seconds(120)));
  const auto ranks = spans_of(trace);
  ASSERT_EQ(ranks.size(), 2u);
  constexpr int kUnits = 3;  // the MLP's Linear layers: lanes 1, 2, 3
  for (const auto& [rank, spans] : ranks) {
    int checked = 0;
    for (int64_t step = 1; step <= 16; ++step) {  // 2 epochs of 8 steps
      for (int u = 1; u < kUnits; ++u) {
        // Forward: unit u's gather begun before unit u-1's forward ended.
        const Span* gather = find_span(spans, 1 + u, step, "all-gather", 0);
        const Span* previous = find_span(spans, u, step, "unit forward");
        ASSERT_TRUE(gather && previous) << "rank " << rank << " step " << step << " unit " << u;
        EXPECT_LT(gather->begin, previous->end) << "rank " << rank << " step " << step;
        // Backward (last unit first): unit u-1's gather begun before unit u's backward ended.
        const Span* back_gather = find_span(spans, u, step, "all-gather", 1);
        const Span* back = find_span(spans, 1 + u, step, "unit backward");
        ASSERT_TRUE(back_gather && back) << "rank " << rank << " step " << step << " unit " << u;
        EXPECT_LT(back_gather->begin, back->end) << "rank " << rank << " step " << step;
        checked += 2;
      }
    }
    EXPECT_EQ(checked, 16 * (kUnits - 1) * 2);
  }
}

TEST(FsdpTrain, OptionsItCannotHonourAreRefusedByName) {
  for (const auto& [option, value] :
       std::vector<std::pair<std::string, std::string>>{{"--zero", ""},
                                                        {"--uneven", ""},
                                                        {"--sync", "diloco"},
                                                        {"--comm-hook", "powersgd"},
                                                        {"--check-params-every", "1"},
                                                        {"--bucket-cap-mb", "auto"}}) {
    TempDir out;
    std::vector<std::string> extra = {"--fsdp", option};
    if (!value.empty()) extra.push_back(value);
    const auto r =
        ddp::testing::run_process(train("random_linear.yaml", out.path(), extra), {}, seconds(60));
    EXPECT_NE(r.exit_code, 0) << option;
    EXPECT_NE(
        r.output.find(fmt::format("key 'fsdp': cannot be combined with {}", option.substr(2))),
        std::string::npos)
        << r.output;
  }
}

// --parallel fsdp is --fsdp: the same run, bitwise; a second key naming another mode is refused at
// start, naming both.
TEST(FsdpTrain, TheKeyParallelTrainsAsTheFsdpKeyAndAConflictIsRefused) {
  TempDir by_alias, by_parallel;
  const std::vector<std::string> job = {"--epochs", "2", "--optimizer", "adam", "--lr", "0.01"};
  auto with = [&](std::vector<std::string> mode) {
    mode.insert(mode.end(), job.begin(), job.end());
    return mode;
  };
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("random_linear.yaml", by_alias.path(), with({"--fsdp"})), seconds(120)));
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("random_linear.yaml", by_parallel.path(), with({"--parallel", "fsdp"})),
      seconds(120)));
  ddp::testing::expect_same_weights(model_of(by_parallel), model_of(by_alias));
  TempDir out;
  const auto r = ddp::testing::run_process(
      train("random_linear.yaml", out.path(), {"--parallel", "zero", "--fsdp"}), {}, seconds(60));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("key 'fsdp': cannot be combined with parallel zero"), std::string::npos)
      << r.output;
}

// fp16 autocast with a GradScaler under --fsdp: the scaler unscales the shards' gradients and its
// inf check spans every rank's shards (PyTorch's ShardedGradScaler), so a step is skipped on all
// ranks or none: the weights and the scaler's state end as DDP's under --amp fp16. LibTorch 1.13
// has no CPU fp16 autocast and refuses it at start, naming why.
TEST(FsdpTrain, AmpFp16WithItsGradScalerEqualsDdp) {
  const std::string unsupported = ddp::amp::autocast_unsupported(torch::kCPU, torch::kHalf);
  if (!unsupported.empty()) {
    TempDir out;
    const auto r = ddp::testing::run_process(
        train("random_linear.yaml", out.path(), {"--fsdp", "--amp", "fp16"}), {}, seconds(60));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("cannot run fp16 autocast on cpu (" + unsupported + ")"),
              std::string::npos)
        << r.output;
    return;
  }
  TempDir replicated, sharded;
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("fashion_mnist_mlp.yaml", replicated.path(), mlp(16, {"--amp", "fp16"})), seconds(120)));
  expect_ranks_ok(ddp::testing::run_env_ranks(
      2, train("fashion_mnist_mlp.yaml", sharded.path(), mlp(16, {"--fsdp", "--amp", "fp16"})),
      seconds(120)));
  expect_close_weights(model_of(sharded), model_of(replicated), kTolerance);
  const auto a = ddp::train::read_checkpoint(replicated.file("checkpoint.pt"));
  const auto b = ddp::train::read_checkpoint(sharded.file("checkpoint.pt"));
  ASSERT_TRUE(a.grad_scaler && b.grad_scaler);
  EXPECT_EQ(b.grad_scaler->scale, a.grad_scaler->scale);
  EXPECT_EQ(b.grad_scaler->growth_tracker, a.grad_scaler->growth_tracker);
}

}  // namespace
