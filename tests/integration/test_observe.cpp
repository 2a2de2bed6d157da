// What a user sees of a run: the timeline of a real 2-rank job (--timeline), and rank 0's
// progress, as log lines through a pipe and as a bar on a terminal (a pseudo-terminal from
// util-linux's `script`).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <set>

#include "built_paths.h"
#include "ranks.h"
#include "subprocess.h"

namespace {

using ddp::testing::TempDir;

std::vector<std::string> mlp_job(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      DDP_TRAIN_BIN,  "--config",  std::string(DDP_SOURCE_DIR) + "/configs/fashion_mnist_mlp.yaml",
      "--epochs",     "1",         "--train-subset",
      "2048",         "--threads", "1",
      "--test-subset", "1000",     "--output-dir", out};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

struct Span {
  std::string name;
  int tid = 0;
  double begin = 0, end = 0;
  int64_t step = -1;
};

TEST(Timeline, TwoRanksShowEveryPhaseAndAllReducesOverlappingBackward) {
  TempDir dir;
  const std::string trace = dir.file("trace.json");
  // Two buckets for the MLP: the first (0.1 MiB) holds the last layers' gradients and is
  // all-reduced while the first layer's gradients are still being computed.
  auto job = mlp_job(dir.file("run"), {"--timeline", trace, "--first-bucket-mb", "0.1"});
  job.insert(job.begin(), {DDP_LAUNCHER_BIN, "--nproc", "2"});
  const auto r = ddp::testing::run_process(job, {}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("timeline: "), std::string::npos) << r.output;

  // Valid JSON by Python's own parser.
  const auto valid = ddp::testing::run_process(
      {DDP_PYTHON, "-c", "import json, sys; json.load(open(sys.argv[1]))", trace});
  ASSERT_EQ(valid.exit_code, 0) << valid.output;

  std::map<int, std::vector<Span>> ranks;
  const auto document = nlohmann::json::parse(ddp::testing::read_file(trace));
  for (const auto& e : document.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    Span s;
    s.name = e.at("name").get<std::string>();
    s.tid = e.at("tid").get<int>();
    s.begin = e.at("ts").get<double>();
    s.end = s.begin + e.at("dur").get<double>();
    s.step = e.at("args").value("step", int64_t{-1});
    ranks[e.at("pid").get<int>()].push_back(s);
  }
  ASSERT_EQ(ranks.size(), 2u);
  for (const auto& [rank, spans] : ranks) {
    std::set<std::string> names;
    std::set<int> bucket_lanes;
    for (const auto& s : spans) {
      names.insert(s.name);
      if (s.name == "all-reduce") bucket_lanes.insert(s.tid);
    }
    for (const char* name :
         {"data wait", "forward", "backward", "finalize: wait for all-reduces",
          "last gradient ready", "all-reduce", "optimizer step", "evaluation", "checkpoint"}) {
      EXPECT_TRUE(names.count(name)) << "rank " << rank << " has no '" << name << "' event";
    }
    EXPECT_EQ(bucket_lanes, (std::set<int>{1, 2})) << "rank " << rank;

    // Overlap: an all-reduce that began inside backward before the step's last gradient was
    // ready, i.e. while gradients were still being computed.
    std::map<int64_t, Span> backward, last_gradient;
    for (const auto& s : spans) {
      if (s.name == "backward") backward[s.step] = s;
      if (s.name == "last gradient ready") last_gradient[s.step] = s;
    }
    int overlapping = 0;
    for (const auto& s : spans) {
      if (s.name != "all-reduce" || !backward.count(s.step) || !last_gradient.count(s.step)) {
        continue;
      }
      if (s.begin >= backward[s.step].begin && s.begin < last_gradient[s.step].begin) ++overlapping;
    }
    EXPECT_GT(overlapping, 0) << "rank " << rank << ": no all-reduce overlaps backward";
  }
}

TEST(Progress, ALogGetsPeriodicPlainLines) {
  TempDir dir;
  // Through a pipe (not a terminal): auto means lines.
  const auto r = ddp::testing::run_process(mlp_job(dir.path(), {"--progress-every", "0.01"}), {},
                                           std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::regex line(
      R"(\[info\] epoch 1/1: step (\d+)/32 \(\d+%\), loss \d+\.\d{4}, \d+ samples/s, (ETA|in) \d+:\d\d)");
  const auto count = std::distance(std::sregex_iterator(r.output.begin(), r.output.end(), line),
                                   std::sregex_iterator());
  EXPECT_GE(count, 2) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no redraws in a log";

  const auto off = ddp::testing::run_process(mlp_job(dir.path(), {"--progress", "off"}), {},
                                             std::chrono::seconds(60));
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find("step 1/32"), std::string::npos) << off.output;
}

TEST(Progress, ATerminalGetsABarPerEpochRedrawnInPlace) {
  TempDir dir;
  // `script` runs the command on a pseudo-terminal, so ddp_train's stdout is a terminal.
  std::string command;
  for (const auto& arg : mlp_job(dir.path(), {"--epochs", "2"})) command += "'" + arg + "' ";
  const auto r = ddp::testing::run_process({"script", "-qefc", command, "/dev/null"}, {},
                                           std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Each epoch leaves its finished bar standing on its own line.
  for (const char* epoch : {"1/2", "2/2"}) {
    const std::regex done(std::string(R"(\repoch )") + epoch +
                          R"( \[=+\] 32/32 loss \d+\.\d{4} \d+ samples/s in \d+:\d\d\x1b\[K\r?\n)");
    EXPECT_TRUE(std::regex_search(r.output, done)) << epoch << "\n" << r.output;
  }
}

// Open MPI gives each rank a pseudo-terminal even when mpirun's own output is a file or a pipe
// (checked first: without it this test would prove nothing), so isatty says yes; auto must still
// mean lines, or rank 0 redraws its bar into the file.
TEST(Progress, UnderMpirunAFileGetsLinesNotRedraws) {
  const auto tty = ddp::testing::run_mpirun(1, {"sh", "-c", "test -t 1"}, std::chrono::seconds(60));
  ASSERT_EQ(tty.exit_code, 0) << "mpirun's ranks have no terminal for stdout here\n" << tty.output;

  TempDir dir;
  const auto r = ddp::testing::run_mpirun(2, mlp_job(dir.path(), {"--progress-every", "0.01"}),
                                          std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("launched by mpirun: 2 rank(s)"), std::string::npos) << r.output;
  const std::regex line(R"(\[info\] epoch 1/1: step \d+/16 \(\d+%\), loss \d+\.\d{4})");
  EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "no redraws under mpirun:\n" << r.output;
  EXPECT_EQ(r.output.find("\x1b[K"), std::string::npos) << r.output;
}

}  // namespace
