// What a run shows of itself, as pure logic: the progress line and bar (--progress), and the
// timeline's Chrome trace events (--timeline) from hand-made spans.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "ddp/train/progress.h"
#include "ddp/train/timeline.h"
#include "subprocess.h"

namespace {

using ddp::train::ProgressState;
using ddp::train::ProgressStyle;
using ddp::train::Timeline;

ProgressState state(int64_t step, int64_t steps, double elapsed_s) {
  ProgressState s;
  s.epoch = 2;
  s.epochs = 5;
  s.step = step;
  s.steps = steps;
  s.loss = 0.42311;
  s.samples_per_s = 1234.4;
  s.elapsed_s = elapsed_s;
  s.timed_steps = step;
  return s;
}

TEST(Progress, StyleIsABarOnATerminalLinesElsewhereAndNothingOffRankZero) {
  using ddp::train::progress_style;
  const bool tty = true, mpirun = true, main = true;
  EXPECT_EQ(progress_style("auto", tty, !mpirun, main), ProgressStyle::kBar);
  EXPECT_EQ(progress_style("auto", !tty, !mpirun, main), ProgressStyle::kLines);
  EXPECT_EQ(progress_style("bar", !tty, !mpirun, main), ProgressStyle::kBar);
  EXPECT_EQ(progress_style("lines", tty, !mpirun, main), ProgressStyle::kLines);
  EXPECT_EQ(progress_style("off", tty, !mpirun, main), ProgressStyle::kOff);
  EXPECT_EQ(progress_style("bar", tty, !mpirun, !main), ProgressStyle::kOff);
}

// mpirun gives its ranks a pseudo-terminal even when its own output goes to a file: there auto
// means lines whatever isatty says; an explicit setting is obeyed.
TEST(Progress, UnderMpirunAutoIsLinesEvenOnItsPseudoTerminal) {
  using ddp::train::progress_style;
  const bool tty = true, mpirun = true, main = true;
  EXPECT_EQ(progress_style("auto", tty, mpirun, main), ProgressStyle::kLines);
  EXPECT_EQ(progress_style("auto", !tty, mpirun, main), ProgressStyle::kLines);
  EXPECT_EQ(progress_style("bar", tty, mpirun, main), ProgressStyle::kBar);
  EXPECT_EQ(progress_style("bar", !tty, mpirun, main), ProgressStyle::kBar);
  EXPECT_EQ(progress_style("lines", tty, mpirun, main), ProgressStyle::kLines);
  EXPECT_EQ(progress_style("off", tty, mpirun, main), ProgressStyle::kOff);
  EXPECT_EQ(progress_style("auto", tty, mpirun, !main), ProgressStyle::kOff);
}

TEST(Progress, DurationsAndTheEtaAtTheEpochsRateSoFar) {
  using ddp::train::eta_seconds;
  using ddp::train::format_duration;
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(42.4), "0:42");
  EXPECT_EQ(format_duration(125), "2:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-3), "0:00");
  // 312 of 938 steps in 10 s: 626 steps left at 31.2 steps/s.
  EXPECT_NEAR(eta_seconds(state(312, 938, 10.0)), 626.0 * 10.0 / 312.0, 1e-9);
  EXPECT_EQ(eta_seconds(state(938, 938, 10.0)), 0.0);
  EXPECT_EQ(eta_seconds(state(0, 938, 0.0)), 0.0);
  // A resumed epoch skipped 300 steps: only the 12 timed ones set the rate.
  auto resumed = state(312, 938, 1.0);
  resumed.timed_steps = 12;
  EXPECT_NEAR(eta_seconds(resumed), 626.0 / 12.0, 1e-9);
}

TEST(Progress, TheBarAndTheLogLine) {
  EXPECT_EQ(ddp::train::progress_bar(state(469, 938, 10.0), 10),
            "epoch 2/5 [=====>    ] 469/938 loss 0.4231 1234 samples/s ETA 0:10");
  EXPECT_EQ(ddp::train::progress_bar(state(938, 938, 63.0), 10),
            "epoch 2/5 [==========] 938/938 loss 0.4231 1234 samples/s in 1:03");
  EXPECT_EQ(ddp::train::progress_bar(state(0, 938, 0.0), 4),
            "epoch 2/5 [>   ] 0/938 loss 0.4231 1234 samples/s ETA 0:00");
  EXPECT_EQ(ddp::train::progress_line(state(312, 938, 10.0)),
            "epoch 2/5: step 312/938 (33%), loss 0.4231, 1234 samples/s, ETA 0:20");
}

TEST(Timeline, TraceEventsAreChromeCompleteEventsOnTheRanksLanes) {
  Timeline timeline;
  const auto t0 = Timeline::Clock::now();
  const auto at = [&](int us) { return t0 + std::chrono::microseconds(us); };
  timeline.add("backward", "compute", Timeline::kStepLane, at(100), at(400), 7);
  timeline.add("all-reduce", "comm", Timeline::kBucketLane + 1, at(250), at(900), 7, 4096);
  // Written against an origin 1 s before this timeline started.
  const std::string trace =
      ddp::train::chrome_trace({timeline.trace_events(3, timeline.start_wall() - 1.0)});
  const auto root = nlohmann::json::parse(trace);
  const auto& events = root.at("traceEvents");
  ASSERT_TRUE(events.is_array()) << trace;
  std::map<std::string, nlohmann::json> complete;  // name -> event
  std::vector<std::string> lanes;
  for (const auto& e : events) {
    EXPECT_EQ(e.at("pid"), 3);
    if (e.at("ph") == "X") complete[e.at("name").get<std::string>()] = e;
    if (e.at("name") == "thread_name") lanes.push_back(e.at("args").at("name").get<std::string>());
  }
  EXPECT_EQ(lanes, (std::vector<std::string>{"training step", "bucket 0 all-reduce",
                                             "bucket 1 all-reduce"}));
  ASSERT_EQ(complete.size(), 2u) << trace;
  const auto& backward = complete["backward"];
  const auto& reduce = complete["all-reduce"];
  EXPECT_EQ(backward.at("tid"), 0);
  EXPECT_EQ(reduce.at("tid"), 2);
  EXPECT_EQ(reduce.at("cat"), "comm");
  EXPECT_EQ(reduce.at("args").at("bytes"), 4096);
  EXPECT_EQ(backward.at("args").at("step"), 7);
  EXPECT_NEAR(backward.at("dur").get<double>(), 300.0, 1e-3);
  EXPECT_NEAR(reduce.at("ts").get<double>() - backward.at("ts").get<double>(), 150.0, 1e-3);
  // Steady times become microseconds after the origin; t0 is at or after the start.
  EXPECT_GE(backward.at("ts").get<double>(), 1e6 + 100.0 - 1.0);
  EXPECT_LT(backward.at("ts").get<double>(), 1e6 + 100.0 + 5e5);

  // Python's json reads the file as well.
  ddp::testing::TempDir dir;
  ddp::testing::write_file(dir.file("trace.json"), trace);
  const auto python = ddp::testing::run_process(
      {DDP_PYTHON, "-c", "import json, sys; json.load(open(sys.argv[1], encoding='utf-8'))",
       dir.file("trace.json")});
  EXPECT_EQ(python.exit_code, 0) << python.output;
}

TEST(Timeline, CountersAndInstantsAreChromeEventsOfTheRank) {
  Timeline timeline;
  const auto t0 = Timeline::Clock::now();
  timeline.add_counter("step ms", t0 + std::chrono::microseconds(500),
                       {{"data", 1.5}, {"compute", 41.0}});
  timeline.add_instant("straggler: rank 1 computes 2.9x slower", t0 + std::chrono::milliseconds(1));
  const auto root = nlohmann::json::parse(
      ddp::train::chrome_trace({timeline.trace_events(1, timeline.start_wall())}));
  std::map<std::string, nlohmann::json> marks;  // phase -> event
  for (const auto& e : root.at("traceEvents")) {
    if (e.at("ph") == "C" || e.at("ph") == "i") marks[e.at("ph").get<std::string>()] = e;
  }
  ASSERT_EQ(marks.size(), 2u) << root.dump();
  EXPECT_EQ(marks["C"].at("name"), "step ms");
  EXPECT_EQ(marks["C"].at("pid"), 1);
  EXPECT_EQ(marks["C"].at("args"), (nlohmann::json{{"data", 1.5}, {"compute", 41.0}}));
  EXPECT_EQ(marks["i"].at("name"), "straggler: rank 1 computes 2.9x slower");
  EXPECT_EQ(marks["i"].at("s"), "p");
  EXPECT_NEAR(marks["i"].at("ts").get<double>() - marks["C"].at("ts").get<double>(), 500.0, 1e-3);
}

TEST(Timeline, KeepsAtMostItsLimitAndCountsTheRest) {
  Timeline timeline(2);
  const auto t = Timeline::Clock::now();
  for (int i = 0; i < 5; ++i) timeline.add("forward", "compute", Timeline::kStepLane, t, t, i);
  timeline.add_instant("straggler", t);  // marks count against the same limit
  EXPECT_EQ(timeline.events().size(), 2u);
  EXPECT_TRUE(timeline.marks().empty());
  EXPECT_EQ(timeline.dropped(), 4u);
}

}  // namespace
