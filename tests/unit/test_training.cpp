// Training end to end in one process: the loss falls and the MLP learns Fashion-MNIST.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>

#include "ddp/train/distributed.h"
#include "ddp/train/metrics.h"
#include "ddp/train/trainer.h"
#include "ddp/train/workload.h"
#include "run_files.h"
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
  ASSERT_TRUE(m.test.has_value());
  EXPECT_LT(m.test->loss, 0.6);
  EXPECT_LT(m.train_loss, initial_loss);
  EXPECT_GE(*m.test->accuracy, 0.80);
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
  ASSERT_TRUE(result.epochs.back().test.has_value());
  EXPECT_FALSE(result.epochs.back().test->accuracy.has_value());  // regression: no accuracy
  EXPECT_LT(result.epochs.back().test->loss, 0.1 * initial);
  EXPECT_EQ(result.epochs.back().steps, 20 * 4);  // 100 samples in batches of 30: 4 steps
}

TEST(Training, SameSeedSameParameters) {
  auto train_once = [](const std::string& dir) {
    Config c;
    c.model = "linear";
    c.dataset = "random";
    c.epochs = 2;
    c.optimizer = ddp::train::Optimizer::kAdam;
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

// The informer workload on the synthetic series: the model never reads the values it forecasts
// (the decoder gets zeros in their place), and the naive forecast repeats the last known value.
TEST(Training, InformerWorkloadNeverReadsTheFutureAndHasANaiveForecast) {
  Config c;
  c.model = "informer";
  c.dataset = "csv";
  c.time_series.seq_len = 48;
  c.time_series.label_len = 24;
  c.time_series.pred_len = 12;
  c.informer.d_model = 16;
  c.informer.d_ff = 16;
  auto w = ddp::train::make_workload(c);
  EXPECT_EQ(w.train_set.size(), 7000 - 48 - 12 + 1);
  ASSERT_TRUE(w.val_set.has_value());
  EXPECT_EQ(w.val_set->size(), 1000 + 48 - 48 - 12 + 1);
  EXPECT_EQ(w.test_set.size(), 2000 + 48 - 48 - 12 + 1);
  w.module->eval();
  torch::NoGradGuard no_grad;
  const auto window = w.test_set.gather(torch::tensor({0, 7, 500})).input;
  auto future_changed = window.clone();
  future_changed.narrow(1, 48, 12).narrow(2, 0, 11).normal_();
  torch::manual_seed(9);  // ProbSparse samples keys at random: the same sample both times
  const auto out = w.forward(window);
  torch::manual_seed(9);
  EXPECT_TRUE(torch::equal(out, w.forward(future_changed)));
  auto past_changed = window.clone();
  past_changed.narrow(1, 40, 1).narrow(2, 0, 11).add_(1.0);
  torch::manual_seed(9);
  EXPECT_FALSE(torch::equal(out, w.forward(past_changed)));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 12, 11}));

  const auto naive = w.naive(window);
  ASSERT_EQ(naive.sizes(), out.sizes());
  for (int64_t h : {0, 11})
    EXPECT_TRUE(torch::equal(naive.select(1, h), window.select(1, 47).narrow(1, 0, 11)));
}

}  // namespace

namespace {
// JSON has no NaN or infinity: a diverged run's metrics file must still parse (plot_metrics).
// threads_per_rank(configured, omp_set, default, affinity cores, host cores, local ranks).
TEST(Threads, RanksThatWouldShareCoresGetTheirShareAndNoMore) {
  using ddp::train::threads_per_rank;
  EXPECT_EQ(threads_per_rank(3, false, 2, 2, 2, 2), 3);     // --threads wins
  EXPECT_EQ(threads_per_rank(0, true, 2, 2, 2, 2), 0);      // so does OMP_NUM_THREADS
  EXPECT_EQ(threads_per_rank(0, false, 2, 2, 2, 2), 1);     // Open MPI 5, unbound: 2 cores, 2 ranks
  EXPECT_EQ(threads_per_rank(0, false, 2, 1, 2, 2), 1);     // Open MPI 4 binds each rank to a core
  EXPECT_EQ(threads_per_rank(0, false, 1, 1, 2, 2), 0);     // LibTorch's default is 1 already
  EXPECT_EQ(threads_per_rank(0, false, 16, 4, 16, 4), 4);   // srun: each task its own 4 CPUs
  EXPECT_EQ(threads_per_rank(0, false, 16, 16, 16, 4), 4);  // unbound: a quarter each
  EXPECT_EQ(threads_per_rank(0, false, 16, 16, 16, 1), 0);  // alone on the host: the default
  EXPECT_EQ(threads_per_rank(0, false, 2, 2, 2, 3), 1);     // more ranks than cores: at least 1
  EXPECT_EQ(threads_per_rank(0, false, 2, 0, 2, 2), 0);     // affinity unknown: the default
}

// OpenBLAS, LibTorch's BLAS on Debian, in either build: the OpenMP one, and the pthreads one
// that LibTorch's own count does not reach (a second registration loads it, tests/CMakeLists.txt).
// With more than one core, a rank told 1 thread would otherwise run its matmuls on one per core.
TEST(Threads, SetIntraOpThreadsSetsOpenBlasThreadsInEitherBuild) {
  using Get = int (*)();
  const auto blas_threads = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto blas_build = reinterpret_cast<Get>(::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  ASSERT_NE(blas_threads, nullptr) << "this process's BLAS is not OpenBLAS";
  ASSERT_NE(blas_build, nullptr);
  // 1: pthreads, 2: OpenMP (openblas_get_parallel); the registration says which it loaded.
  if (const char* expected = std::getenv("DDP_TEST_OPENBLAS_PARALLEL")) {
    ASSERT_EQ(blas_build(), std::atoi(expected)) << "LD_LIBRARY_PATH did not load that build";
  }
  const int before = torch::get_num_threads();
  ddp::train::set_intra_op_threads(1);
  EXPECT_EQ(torch::get_num_threads(), 1);
  EXPECT_EQ(blas_threads(), 1) << "OpenBLAS build " << blas_build();
  ddp::train::set_intra_op_threads(before);
}

TEST(Metrics, NonFiniteValuesAreWrittenAsNull) {
  ddp::train::EpochMetrics m;
  m.epoch = 3;
  m.train_loss = std::numeric_limits<double>::quiet_NaN();
  ddp::train::Scores test;
  test.loss = std::numeric_limits<double>::infinity();
  test.accuracy = 0.1;
  m.test = test;
  const auto json = nlohmann::json::parse(ddp::train::to_json(m));
  EXPECT_TRUE(json.at("train_loss").is_null()) << json;
  EXPECT_TRUE(json.at("test_loss").is_null()) << json;
  EXPECT_EQ(json.at("test_accuracy"), 0.1) << json;
}

// A membership change's reason comes from an error message, whose bytes may not be UTF-8: the
// line is written all the same, with U+FFFD for each such byte, as the flight records do.
TEST(Metrics, BytesThatAreNotUtf8BecomeTheReplacementCharacter) {
  ddp::train::EpochMetrics m;
  m.epoch = 1;
  ddp::train::MembershipRecord change;
  change.why = "lost host \xff";
  m.membership_changes.push_back(change);
  const auto json = nlohmann::json::parse(ddp::train::to_json(m));
  EXPECT_EQ(json.at("membership_changes").at(0).at("why"), "lost host \xef\xbf\xbd") << json;
}

// Reads metrics.jsonl line by line with Python's json: one object a line, the keys in their
// documented order, each figure the number written (to 9 significant digits), null for NaN.
constexpr const char* kCheckMetrics = R"(
import json, sys
keys = ["epoch", "steps", "lr", "train_loss", "val_loss", "val_mae", "test_loss", "test_accuracy",
        "test_mae", "naive_test_loss", "naive_test_mae", "samples_per_s", "epoch_seconds",
        "grad_bytes_per_step"]
with open(sys.argv[1], encoding="utf-8") as f:
    lines = f.read().split("\n")
assert lines[-1] == "", "the last line has no newline"
records = [json.loads(line) for line in lines[:-1]]
assert [list(r) for r in records] == [keys, keys], records
first, second = records
assert (first["epoch"], first["steps"], first["lr"]) == (1, 3, 0.025), first
assert first["train_loss"] == 0.123456789 and first["samples_per_s"] == 1234.57, first
assert first["val_loss"] is None and first["test_accuracy"] == 0.875, first
assert second["train_loss"] is None and second["val_loss"] == 1e-07, second
)";

TEST(Metrics, TheFileIsJsonLinesThatPythonAndTheTestsReadBackEqual) {
  ddp::testing::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  ddp::train::EpochMetrics m;
  m.epoch = 1;
  m.steps = 3;
  m.lr = 0.025;
  m.train_loss = 0.123456789123;
  m.samples_per_s = 1234.5678;
  ddp::train::Scores test;
  test.loss = 0.5;
  test.accuracy = 0.875;
  m.test = test;
  {
    ddp::train::MetricsWriter writer(path);
    writer.write(m);
    m.epoch = 2;
    m.train_loss = std::numeric_limits<double>::quiet_NaN();
    ddp::train::Scores val;
    val.loss = 1e-7;
    m.val = val;
    writer.write(m);
  }
  const auto python = ddp::testing::run_process({DDP_PYTHON, "-c", kCheckMetrics, path});
  EXPECT_EQ(python.exit_code, 0) << python.output;
  // The tests' reader and a resume's (metrics_up_to) see the same figures and lines.
  const std::string jsonl = ddp::testing::read_file(path);
  EXPECT_EQ(ddp::testing::metrics_field(jsonl, "train_loss"), 0.123456789);
  EXPECT_EQ(ddp::testing::metrics_field(jsonl, "lr"), 0.025);
  EXPECT_EQ(ddp::train::metrics_up_to(jsonl, 1), jsonl.substr(0, jsonl.find('\n') + 1));
  EXPECT_EQ(ddp::train::metrics_up_to(jsonl, 2), jsonl);
}
}  // namespace
