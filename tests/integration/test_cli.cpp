// ddp_train as a user runs it: --help, --version, a run, and every bad input exits 2 with one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>

#include "built_paths.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/train/config.h"
#include "subprocess.h"

namespace {

using ddp::testing::run_process;
using ddp::testing::TempDir;

ddp::testing::ProcessResult ddp_train(std::vector<std::string> args) {
  args.insert(args.begin(), DDP_TRAIN_BIN);
  return run_process(args, {}, std::chrono::seconds(60));
}

// A bad input: exit code 2, one error line that contains `expected`, no stack dump.
void expect_bad_input(const std::vector<std::string>& args, const std::string& expected) {
  auto r = ddp_train(args);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const auto error_line = r.output.find("[error] ");
  ASSERT_NE(error_line, std::string::npos) << r.output;
  EXPECT_EQ(error_line, r.output.rfind("[error] ")) << r.output;  // exactly one
  const auto line_end = r.output.find('\n', error_line);
  EXPECT_NE(r.output.substr(error_line, line_end - error_line).find(expected), std::string::npos)
      << r.output;
  EXPECT_EQ(line_end + 1, r.output.size()) << "the error is the last line:\n" << r.output;
  for (const char* dump : {"terminate called", "Exception raised from", "frame #"}) {
    EXPECT_EQ(r.output.find(dump), std::string::npos) << r.output;
  }
}

TEST(Cli, HelpListsEveryKeyWithItsDefault) {
  auto r = ddp_train({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const auto& key : ddp::train::config_keys()) {
    EXPECT_NE(r.output.find("--" + key.name + " "), std::string::npos) << key.name;
  }
  EXPECT_NE(r.output.find("(default: 64)"), std::string::npos);
  // --backend auto as comm::default_backend decides it (test_comm.cpp's Launch tests).
  EXPECT_NE(ddp::train::find_config_key("backend")->help.find(
                "auto: nccl on CUDA; on CPU shm, which is gloo across hosts, mpi under mpirun "
                "across hosts; local at world size 1"),
            std::string::npos);
}

TEST(Cli, VersionNamesLibTorchAndBackends) {
  auto r = ddp_train({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(std::regex_search(r.output, std::regex("ddp_train [0-9]+\\.[0-9]+\\.[0-9]+")));
  EXPECT_TRUE(std::regex_search(r.output, std::regex("LibTorch [0-9]+\\.[0-9]+")));
  EXPECT_NE(r.output.find("backends: "), std::string::npos);
  // The test builds find libunwind and libdw (scripts/install-deps.sh).
  EXPECT_NE(r.output.find("stack traces: libunwind, libdw\n"), std::string::npos) << r.output;
}

TEST(Cli, ConfigFileWithCommandLineOverride) {
  TempDir dir;
  auto r = ddp_train({"--config", std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml",
                      "--epochs", "2", "--output-dir", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("epoch 2/2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 2 epochs"), std::string::npos) << r.output;
  // The resolved config holds the file's model and the command line's epochs.
  const auto resolved = ddp::testing::read_file(dir.file("config.yaml"));
  EXPECT_NE(resolved.find("model: linear\n"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("epochs: 2\n"), std::string::npos) << resolved;
  const auto metrics = ddp::testing::read_file(dir.file("metrics.jsonl"));
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2) << metrics;
}

// The variables of the test hooks ddp_train once read (its faults now live in the tests'
// ddp_fault_train): a user who sets them gets a plain run. Any of them acted on would kill the run
// (SIGKILL, SIGTERM with --checkpoint-on-signal: exit 143), fail it (a perturbed parameter under
// --check-params-every), or hold it past the 60 s limit (a 600 s delay).
TEST(Cli, TheOldTestHookVariablesDoNothing) {
  TempDir dir;
  const std::map<std::string, std::string> env = {
      {"DDP_TEST_CRASH_AT_STEP", "3"},   {"DDP_TEST_CRASH_RANK", "0"},
      {"DDP_TEST_SIGTERM_AT_STEP", "2"}, {"DDP_TEST_SIGTERM_RANK", "0"},
      {"DDP_TEST_PERTURB_AT_STEP", "1"}, {"DDP_TEST_PERTURB_RANK", "0"},
      {"DDP_TEST_DELAY_SEQ", "3"},       {"DDP_TEST_DELAY_RANK", "0"},
      {"DDP_TEST_DELAY_S", "600"},       {"DDP_TEST_WRITE_DELAY_MS", "600000"}};
  auto r = run_process(
      {DDP_TRAIN_BIN, "--config", std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml",
       "--epochs", "2", "--checkpoint-on-signal", "--check-params-every", "1", "--output-dir",
       dir.path()},
      env, std::chrono::seconds(60));
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done: 2 epochs"), std::string::npos) << r.output;
}

TEST(Cli, BadInputsExitTwoWithOneLine) {
  TempDir dir;
  expect_bad_input({"--batch-size", "0"},
                   "command line: key 'batch-size': expected a positive integer, got '0'");
  expect_bad_input({"--lr", "0"}, "key 'lr': expected a number > 0, got '0'");
  expect_bad_input({"--epochs", "x"}, "key 'epochs': expected an integer, got 'x'");
  expect_bad_input({"--no-such-option"}, "command line: ");
  expect_bad_input({"--config", dir.file("missing.yaml")},
                   dir.file("missing.yaml") + ": config file not found");
  ddp::testing::write_file(dir.file("bad.yaml"), "epochs: 1\nbogus: 3\n");
  expect_bad_input({"--config", dir.file("bad.yaml")},
                   dir.file("bad.yaml") + ":2: unknown key 'bogus'");
  expect_bad_input({"--data", dir.path(), "--output-dir", dir.file("out")},
                   dir.file("train-images-idx3-ubyte.gz") + ": no such file");
  ddp::testing::write_file(dir.file("train-images-idx3-ubyte"),
                           std::string("\0\0\x08\x01\0\0\0\x01x", 9));
  expect_bad_input({"--data", dir.path(), "--output-dir", dir.file("out")},
                   "wrong IDX magic number");
}

// Bool options as docs/training.md writes them, through the real parser: every one spaced
// ("--broadcast-buffers false"), then a bare flag before another option, the "=" form and the
// other bool words. config.yaml holds what was asked; a bad value names the option and the value.
TEST(Cli, BoolOptionsTakeTheFlagTheSpacedAndTheEqualsForm) {
  TempDir dir;
  const std::vector<std::string> job = {"--config",
                                        std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml",
                                        "--output-dir", dir.path()};
  std::vector<std::string> spaced = job;
  std::vector<std::pair<std::string, std::string>> bools;  // key, the value given
  for (const auto& key : ddp::train::config_keys()) {
    if (!key.is_flag) continue;
    // reshard-after-forward's false needs fsdp, checkpoint-async's checkpoint-sharded (both
    // false here): the spaced form, with true.
    const bool refused_false =
        key.name == "reshard-after-forward" || key.name == "checkpoint-async";
    const std::string value = refused_false ? "true" : "false";
    bools.emplace_back(key.name, value);
    spaced.insert(spaced.end(), {"--" + key.name, value});
  }
  spaced.insert(spaced.end(), {"--epochs", "1"});
  auto r = ddp_train(spaced);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto resolved = ddp::testing::read_file(dir.file("config.yaml"));
  for (const auto& [name, value] : bools) {
    EXPECT_NE(resolved.find("\n" + name + ": " + value + "\n"), std::string::npos)
        << name << resolved;
  }
  EXPECT_NE(resolved.find("\nepochs: 1\n"), std::string::npos) << resolved;

  std::vector<std::string> mixed = job;
  mixed.insert(mixed.end(), {"--nesterov", "--epochs", "2", "--drop-last=true",
                             "--broadcast-buffers", "false", "--find-unused-parameters", "yes",
                             "--gradient-as-bucket-view", "on", "--checkpoint-on-signal", "1"});
  r = ddp_train(mixed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("done: 2 epochs"), std::string::npos) << r.output;
  resolved = ddp::testing::read_file(dir.file("config.yaml"));
  for (const char* line : {"nesterov: true", "epochs: 2", "drop-last: true",
                           "broadcast-buffers: false", "find-unused-parameters: true",
                           "gradient-as-bucket-view: true", "checkpoint-on-signal: true"}) {
    EXPECT_NE(resolved.find("\n" + std::string(line) + "\n"), std::string::npos) << line << "\n"
                                                                                 << resolved;
  }

  expect_bad_input({"--augment", "maybe"},
                   "command line: key 'augment': expected true or false, got 'maybe'");
  expect_bad_input({"--nesterov=maybe"},
                   "command line: key 'nesterov': expected true or false, got 'maybe'");
  expect_bad_input({"--epochs", "1", "stray"}, "command line: unexpected argument 'stray'");
}

// The csv dataset: scripts/make_timeseries_csv writes the synthetic series, and each kind of bad
// file or setting is named.
TEST(Cli, TimeSeriesCsvFromTheScriptAndItsBadInputs) {
  TempDir dir;
  auto made = run_process(
      {std::string(DDP_SOURCE_DIR) + "/scripts/make_timeseries_csv", dir.file("data/ts.csv")},
      {{"DDP_TRAIN", DDP_TRAIN_BIN}}, std::chrono::seconds(60));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string csv = ddp::testing::read_file(dir.file("data/ts.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 10001);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "date,x1,x2,x3,x4,x5,x6,x7,x8,x9,x10,OT");

  const std::vector<std::string> job = {"--config",
                                        std::string(DDP_SOURCE_DIR) + "/configs/informer_csv.yaml",
                                        "--output-dir", dir.file("out")};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), job.begin(), job.end());
    return extra;
  };
  expect_bad_input(with({"--data", dir.file("none.csv")}), dir.file("none.csv") + ": cannot open");
  expect_bad_input(with({"--data", dir.file("data/ts.csv"), "--target", "price"}),
                   dir.file("data/ts.csv") + ": no target column 'price' (columns: date, x1");
  expect_bad_input(with({"--data", dir.file("data/ts.csv"), "--seq-len", "7000"}),
                   "10000 rows give the training part 7000 rows, fewer than seq_len + pred_len = "
                   "7024");
  std::string broken = csv;
  broken.replace(broken.find(",-18.9139,"), 10, ",n/a,");  // the second row: line 3
  ddp::testing::write_file(dir.file("broken.csv"), broken);
  expect_bad_input(with({"--data", dir.file("broken.csv")}),
                   dir.file("broken.csv") + ":3: column 'x1': 'n/a' is not a number");
  ddp::testing::write_file(dir.file("empty.csv"), "");
  expect_bad_input(with({"--data", dir.file("empty.csv")}), dir.file("empty.csv") + ": empty file");
  expect_bad_input(with({"--label-len", "100"}), "key 'label-len': 100 is longer than seq-len 96");
  expect_bad_input(with({"--n-heads", "3"}), "key 'd-model': 64 must be even and a multiple of");
  expect_bad_input(with({"--dataset", "fashion-mnist"}),
                   "the informer trains on csv data, and csv data trains the informer");
}

TEST(Cli, ListDevicesOnACpuMachineSaysSo) {
  auto r = ddp_train({"--list-devices"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (ddp::comm::list_cuda_devices().empty()) {
    EXPECT_NE(r.output.find("no CUDA devices"), std::string::npos) << r.output;
  } else {
    EXPECT_NE(r.output.find("cuda:0"), std::string::npos) << r.output;
  }
}

TEST(Cli, BackendsThatDoNotFitAreBadInput) {
  TempDir dir;
  const std::vector<std::string> job = {"--config",
                                        std::string(DDP_SOURCE_DIR) + "/configs/random_linear.yaml",
                                        "--output-dir", dir.path()};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), job.begin(), job.end());
    return extra;
  };
  expect_bad_input(with({"--backend", "nccl", "--device", "cpu"}),
                   "backend nccl needs CUDA tensors");
  expect_bad_input(with({"--backend", "mpi"}), "backend mpi needs ranks started by mpirun");
  expect_bad_input(with({"--backend", "tcp"}),
                   "key 'backend': expected one of auto|local|gloo|shm|mpi|nccl");
}

TEST(Cli, UnwritableOutputDirIsBadInput) {
  TempDir dir;
  ddp::testing::write_file(dir.file("file"), "x");
  expect_bad_input(
      {"--model", "linear", "--dataset", "random", "--output-dir", dir.file("file") + "/sub"},
      "output dir '" + dir.file("file") + "/sub': cannot create it");
}

}  // namespace
