// The flight recorder and the hang doctor as pure logic: the ring buffer, its JSON read back,
// the stall warning's text, and the diagnosis of hand-made records.
#include <gtest/gtest.h>

#include <string>

#include "ddp/comm/diagnostics/diagnose.h"
#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/process_group.h"
#include "ddp/common/error.h"
#include "subprocess.h"

namespace {

using ddp::comm::CollectiveRecord;
using ddp::comm::CollectiveState;
using ddp::comm::FlightDump;
using ddp::comm::FlightRecorder;

TEST(FlightRecorder, KeepsTheLastCollectivesWithPhaseAndState) {
  FlightRecorder recorder(3);
  recorder.set_phase("setup");
  recorder.issued(1, "broadcast(root 0)", 40);
  recorder.finished(1, true);
  recorder.set_phase("backward: bucket 0");
  for (uint64_t s = 2; s <= 4; ++s) recorder.issued(s, "all_reduce(avg)", 4096);
  recorder.finished(2, true);
  recorder.finished(3, false);
  const auto records = recorder.records();
  ASSERT_EQ(records.size(), 3u);  // the oldest fell out
  EXPECT_EQ(records[0].seq, 2u);
  EXPECT_EQ(records[0].state, CollectiveState::kDone);
  EXPECT_EQ(records[1].state, CollectiveState::kFailed);
  EXPECT_EQ(records[2].state, CollectiveState::kIssued);
  EXPECT_EQ(records[2].phase, "backward: bucket 0");
  EXPECT_EQ(records[2].bytes, 4096);
  EXPECT_EQ(recorder.last_issued(), 4u);
  ASSERT_TRUE(recorder.oldest_pending().has_value());
  EXPECT_EQ(recorder.oldest_pending()->seq, 4u);

  // The JSON reads back as written, quotes in the reason included.
  const auto dump = ddp::comm::parse_flight_dump(
      recorder.to_json(1, 2, "gloo", "rank 1: \"all_reduce\" timed out\nsecond line"), "r1.json");
  EXPECT_EQ(dump.rank, 1);
  EXPECT_EQ(dump.world_size, 2);
  EXPECT_EQ(dump.reason, "rank 1: \"all_reduce\" timed out\nsecond line");
  EXPECT_EQ(dump.last_issued, 4u);
  ASSERT_EQ(dump.collectives.size(), 3u);
  EXPECT_EQ(dump.collectives[1].op, "all_reduce(avg)");
  EXPECT_EQ(dump.collectives[1].state, CollectiveState::kFailed);
  EXPECT_NEAR(dump.collectives[2].start, records[2].start, 1e-3);
  EXPECT_THROW(ddp::comm::parse_flight_dump("{\"rank\": 1}", "bad.json"), ddp::InputError);
}

// Reads a flight record with Python's json, checks the strings that argv holds, and writes back
// what it read (escaped differently: ensure_ascii), for the C++ reader to read in turn.
constexpr const char* kPythonRoundTrip = R"(
import json, os, sys
path, out = sys.argv[1], sys.argv[5]
# The bytes the test passed, whatever the locale made of them.
phase, op, reason = (os.fsencode(arg).decode("utf-8") for arg in sys.argv[2:5])
with open(path, encoding="utf-8") as f:
    record = json.load(f)
assert record["phase"] == phase, (record["phase"], phase)
assert record["reason"] == reason, (record["reason"], reason)
assert [c["op"] for c in record["collectives"]] == [op, op + " 2"], record["collectives"]
assert all(c["phase"] == phase for c in record["collectives"]), record["collectives"]
with open(out, "w", encoding="ascii") as f:
    json.dump(record, f)
)";

// Strings with quotes, backslashes, newlines, control characters and UTF-8 come back equal
// through Python's json and through the hang doctor's reader.
TEST(FlightRecorder, TheRecordIsJsonThatPythonAndTheDoctorReadBackEqual) {
  const std::string phase = "step 1: \"forward\" \\ of\nline two";
  const std::string op = "all_reduce(\"sum\") \\n\t\x01 caf\xc3\xa9";
  const std::string reason = "rank 0: \"all_reduce\" timed out\nC:\\path";
  FlightRecorder recorder;
  recorder.set_phase(phase);
  recorder.issued(1, op, 8);
  recorder.finished(1, true);
  recorder.issued(2, op + " 2", 16);
  ddp::testing::TempDir dir;
  const std::string written = dir.file("rank0.json"), reread = dir.file("python.json");
  ddp::testing::write_file(written, recorder.to_json(0, 1, "gloo", reason));
  const auto python = ddp::testing::run_process(
      {DDP_PYTHON, "-c", kPythonRoundTrip, written, phase, op, reason, reread});
  ASSERT_EQ(python.exit_code, 0) << python.output;
  for (const auto& file : {written, reread}) {
    const auto dump = ddp::comm::parse_flight_dump(ddp::testing::read_file(file), file);
    EXPECT_EQ(dump.phase, phase) << file;
    EXPECT_EQ(dump.reason, reason) << file;
    ASSERT_EQ(dump.collectives.size(), 2u) << file;
    EXPECT_EQ(dump.collectives[0].op, op) << file;
    EXPECT_EQ(dump.collectives[0].phase, phase) << file;
    EXPECT_EQ(dump.collectives[0].state, CollectiveState::kDone) << file;
    EXPECT_EQ(dump.collectives[1].op, op + " 2") << file;
    EXPECT_EQ(dump.collectives[1].state, CollectiveState::kIssued) << file;
  }
}

// JSON strings are UTF-8: a byte that is not (from an error message) becomes U+FFFD instead of
// costing the record.
TEST(FlightRecorder, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  FlightRecorder recorder;
  recorder.issued(1, "all_reduce \xff", 8);
  const auto dump =
      ddp::comm::parse_flight_dump(recorder.to_json(0, 1, "gloo", "bad \xc3"), "r0.json");
  EXPECT_EQ(dump.reason, "bad \xef\xbf\xbd");
  ASSERT_EQ(dump.collectives.size(), 1u);
  EXPECT_EQ(dump.collectives[0].op, "all_reduce \xef\xbf\xbd");
}

// The message of an InputError that `text` (as file "rank3.json") throws; "" when it parses.
std::string record_error(const std::string& text) {
  try {
    ddp::comm::parse_flight_dump(text, "rank3.json");
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "";
}

TEST(FlightRecorder, ABadRecordIsNamedWithTheLineOrTheFieldAtFault) {
  // A record cut short: where, then the library's words for what.
  EXPECT_EQ(record_error("{\"rank\": 1,\n  \"world_size\": 2,\n")
                .rfind("rank3.json: not a flight record: parse error at line 3, column 1: ", 0),
            0u);
  EXPECT_EQ(record_error(R"({"rank": 1e999})"),
            "rank3.json: not a flight record: number overflow parsing '1e999'");
  EXPECT_EQ(record_error("[1, 2]"),
            "rank3.json: not a flight record: the top level is array, not an object");
  EXPECT_EQ(record_error("{\"rank\": 1}"), "rank3.json: not a flight record: no key 'world_size'");
  const std::string head =
      R"({"rank": 0, "world_size": 1, "backend": "gloo", "reason": "", "time": 1.5, "phase": "",)"
      R"( "last_issued": 1, "collectives": )";
  EXPECT_EQ(record_error(head + "[]}"), "");
  EXPECT_EQ(record_error(head + "{}}"),
            "rank3.json: not a flight record: collectives is object, not an array");
  EXPECT_EQ(record_error(head +
                         R"([{"seq": -1, "op": "x", "phase": "", "bytes": 0, "start": 0, "end": 0,)"
                         R"( "state": "done"}]})"),
            "rank3.json: not a flight record: collectives[0].seq: expected an integer from 0 to "
            "18446744073709551615, got -1");
  EXPECT_EQ(record_error(head + R"([{"seq": 1, "op": 7}]})"),
            "rank3.json: not a flight record: collectives[0].op: expected a string, got 7");
}

TEST(FlightRecorder, StallMessageNamesTheRanksThatHaveNotEnteredTheCollective) {
  CollectiveRecord stalled;
  stalled.seq = 58;
  stalled.op = "all_reduce(avg)";
  stalled.phase = "backward: bucket 1";
  EXPECT_EQ(ddp::comm::stall_message(0, stalled, 61.2, {58, 57, 58, 12}),
            "rank 0: all_reduce(avg) #58 (backward: bucket 1) has waited 61 s for the other ranks; "
            "not entered by rank(s) 1 (at #57), 3 (at #12)");
  EXPECT_NE(ddp::comm::stall_message(0, stalled, 61, {58, 58}).find("every rank has entered it"),
            std::string::npos);
  EXPECT_NE(ddp::comm::stall_message(0, stalled, 61, {}).find("unknown on this backend"),
            std::string::npos);
}

// A rank's dump: collectives {seq, op, phase, start, end, state} up to `last`.
FlightDump dump(int rank, int world, std::vector<CollectiveRecord> collectives,
                std::string phase = "step 3: backward") {
  FlightDump d;
  d.rank = rank;
  d.world_size = world;
  d.reason = "collective failed";
  d.time = 100.0;
  d.phase = std::move(phase);
  d.last_issued = collectives.empty() ? 0 : collectives.back().seq;
  d.collectives = std::move(collectives);
  return d;
}

CollectiveRecord record(uint64_t seq, std::string op, std::string phase, double start, double end,
                        CollectiveState state) {
  CollectiveRecord r;
  r.seq = seq;
  r.op = std::move(op);
  r.phase = std::move(phase);
  r.bytes = 64;
  r.start = start;
  r.end = end;
  r.state = state;
  return r;
}

const auto kDone = CollectiveState::kDone;
const auto kFailed = CollectiveState::kFailed;
const auto kIssued = CollectiveState::kIssued;

TEST(Diagnose, NamesTheRankBehindAndTheCollectiveItDidNotEnter) {
  const auto a = record(11, "all_reduce(avg)", "backward: bucket 0", 1, 2, kDone);
  const auto b = record(12, "all_reduce(avg)", "backward: bucket 1", 3, 0, kIssued);
  const auto report = ddp::comm::diagnose(
      {dump(0, 3, {a, b}), dump(1, 3, {a}, "step 4: forward"), dump(2, 3, {a, b})});
  EXPECT_NE(report.find("diagnosis: rank(s) 1 did not enter collective #12 all_reduce(avg) "
                        "(backward: bucket 1), which rank(s) 0, 2 entered; rank 1 was in "
                        "'step 4: forward'"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 0: last issued #12 all_reduce(avg) (backward: bucket 1): issued, "
                        "waiting for 97.0 s"),
            std::string::npos)
      << report;
}

// The straggler named over the last window before the stall: kept by every rank's recorder,
// written in its record, read back, and the newest one's line ends the report.
TEST(Diagnose, ARankThatWasSlowingBeforeTheStallIsNamedAsSuch) {
  const std::string slowing =
      "straggler: rank 1 computes 4.0x slower than the median of the other ranks over steps 5-8 "
      "(forward+backward+optimizer 8.0 ms vs 2.0 ms a step); data and network normal";
  ddp::comm::FlightRecorder recorder;
  recorder.issued(11, "all_reduce(avg)", 64);
  EXPECT_EQ(recorder.to_json(0, 2, "gloo", "timeout").find("straggler"), std::string::npos);
  recorder.set_straggler(slowing);
  EXPECT_EQ(recorder.straggler(), slowing);
  auto zero = ddp::comm::parse_flight_dump(recorder.to_json(0, 2, "gloo", "timeout"), "rank0.json");
  EXPECT_EQ(zero.straggler, slowing);
  zero.time = 200.0;
  auto one = dump(1, 2, {record(10, "all_reduce(avg)", "backward: bucket 0", 1, 2, kDone)},
                  "step 9: backward");
  one.straggler = "straggler: rank 1 computes 3.0x slower (an older window)";
  const auto report = ddp::comm::diagnose({zero, one});
  EXPECT_NE(report.find("\nbefore the stall, " + slowing + "\n"), std::string::npos) << report;
  EXPECT_EQ(report.find("an older window"), std::string::npos) << report;
  recorder.set_straggler("");  // recovered: nothing written
  EXPECT_EQ(recorder.to_json(0, 2, "gloo", "timeout").find("straggler"), std::string::npos);
}

TEST(Diagnose, NamesARankThatEnteredOnlyAfterTheOthersGaveUp) {
  const auto a = record(11, "broadcast(root 0)", "step 2: forward", 1, 2, kDone);
  const auto report = ddp::comm::diagnose(
      {dump(0, 2, {a, record(12, "all_reduce(avg)", "backward: bucket 0", 3, 7, kFailed)}),
       dump(1, 2, {a, record(12, "all_reduce(avg)", "backward: bucket 0", 11, 11.5, kFailed)})});
  EXPECT_NE(report.find("diagnosis: rank(s) 1 entered collective #12 all_reduce(avg) (backward: "
                        "bucket 0) only after another rank had given up on it"),
            std::string::npos)
      << report;
}

TEST(Diagnose, OtherCases) {
  const auto a = record(5, "all_reduce(sum)", "epoch 1: training metrics", 1, 2, kDone);
  // Different operations under one sequence number.
  auto report = ddp::comm::diagnose(
      {dump(0, 2, {a}), dump(1, 2, {record(5, "barrier", "epoch 1: checkpoint", 1, 0, kIssued)})});
  EXPECT_NE(report.find("diagnosis: ranks disagree on collective #5: rank 0 issued "
                        "all_reduce(sum) of 64 bytes"),
            std::string::npos)
      << report;
  // Everyone with a record done; a missing rank, of which nothing is known.
  report = ddp::comm::diagnose({dump(0, 3, {a}), dump(2, 3, {a})});
  EXPECT_NE(report.find("  no record from rank(s) 1 (killed before writing one? see their logs)\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("diagnosis: no rank with a record lags: every rank with a record (0, 2) "
                        "completed collective #5 all_reduce(sum) (epoch 1: training metrics); no "
                        "record from rank(s) 1 (killed before writing one? see their logs), so "
                        "whether they entered #5 is unknown\n"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("no rank lags"), std::string::npos) << report;
  // Everyone done, every record there.
  report = ddp::comm::diagnose({dump(0, 2, {a}), dump(1, 2, {a})});
  EXPECT_NE(report.find("diagnosis: no rank lags: every rank completed collective #5"),
            std::string::npos)
      << report;
  // Everyone entered in time and nothing completed.
  const auto stuck = record(6, "all_reduce(avg)", "backward: bucket 0", 3, 0, kIssued);
  report = ddp::comm::diagnose({dump(0, 2, {a, stuck}), dump(1, 2, {a, stuck})});
  EXPECT_NE(report.find("every rank entered collective #6"), std::string::npos) << report;
}

// The launcher after a SIGKILL: the killed rank wrote no record, the other one waits in the
// collective the dead rank never joined. One rank's record cannot tell whether "every rank"
// entered it: the diagnosis names the rank without a record, how it ended, and what is unknown.
TEST(Diagnose, ARankWithoutARecordIsNamedAndNeverCountedAsHavingEnteredTheCollective) {
  const auto a = record(8, "all_reduce(avg)", "backward: bucket 0", 1, 2, kDone);
  const auto waiting = record(9, "all_reduce(avg)", "backward: bucket 0", 3, 0, kIssued);
  const auto failed = record(9, "all_reduce(avg)", "backward: bucket 0", 3, 4, kFailed);
  const ddp::comm::RankEnds killed = {{1, "signal SIGKILL (9)"}};
  for (const auto& newest : {waiting, failed}) {
    const auto report = ddp::comm::diagnose({dump(0, 2, {a, newest})}, killed);
    EXPECT_NE(report.find("flight records of 1 of 2 rank(s)"), std::string::npos) << report;
    EXPECT_NE(report.find("  no record from rank(s) 1 (rank 1 ended with signal SIGKILL (9))\n"),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("diagnosis: every rank with a record (0) entered collective #9 "
                          "all_reduce(avg) (backward: bucket 0) and it did not complete; no "
                          "record from rank(s) 1 (rank 1 ended with signal SIGKILL (9)), so "
                          "whether they entered #9 is unknown: a rank that ended or stopped "
                          "before entering it leaves the others waiting just so\n"),
              std::string::npos)
        << report;
    EXPECT_EQ(report.find("every rank entered"), std::string::npos) << report;
    EXPECT_EQ(report.find("every rank completed"), std::string::npos) << report;
  }
  // Three ranks, one behind, one killed, one never heard of: each is named for what it is.
  const auto report =
      ddp::comm::diagnose({dump(0, 4, {a, waiting}), dump(2, 4, {a}, "step 3: forward")}, killed);
  EXPECT_NE(report.find("  no record from rank(s) 1, 3 (rank 1 ended with signal SIGKILL (9); "
                        "the others: see their logs)\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("diagnosis: rank(s) 2 did not enter collective #9 all_reduce(avg) "
                        "(backward: bucket 0), which rank(s) 0 entered; rank 2 was in 'step 3: "
                        "forward' when the records were written; no record from rank(s) 1, 3 "),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("so whether they entered #9 is unknown\n"), std::string::npos) << report;
}

// A record written with stacks names where the main thread was; the doctor prints it per rank,
// the function without its parameters (the stacks file has them), the file without its directory.
TEST(Diagnose, NamesWhereEachRankWasWhenItsStacksWereTaken) {
  FlightRecorder recorder;
  recorder.issued(1, "all_reduce(sum)", 8);
  const ddp::comm::WaitingIn where{"my::eval(int, std::string const&) const", "/home/me/train.cpp",
                                   57, "/out/debug/rank2.stacks.txt"};
  const auto with =
      ddp::comm::parse_flight_dump(recorder.to_json(2, 3, "gloo", "SIGUSR1", where), "rank2.json");
  ASSERT_TRUE(with.waiting_in.has_value());
  EXPECT_EQ(with.waiting_in->function, where.function);
  EXPECT_EQ(with.waiting_in->file, where.file);
  EXPECT_EQ(with.waiting_in->line, 57);
  EXPECT_EQ(with.waiting_in->stacks_file, where.stacks_file);
  const auto without =
      ddp::comm::parse_flight_dump(recorder.to_json(1, 3, "gloo", "SIGUSR1"), "rank1.json");
  EXPECT_FALSE(without.waiting_in.has_value());

  const auto a = record(11, "all_reduce(avg)", "backward: bucket 0", 1, 2, kDone);
  const auto b = record(12, "all_reduce(avg)", "backward: bucket 1", 3, 0, kIssued);
  auto late = dump(2, 3, {a}, "step 4: forward");
  late.waiting_in = where;
  auto waiting = dump(0, 3, {a, b});
  waiting.waiting_in =
      ddp::comm::WaitingIn{"ddp::comm::Work::wait()", "", 0, "/out/rank0.stacks.txt"};
  const auto report = ddp::comm::diagnose({waiting, dump(1, 3, {a, b}), late});
  EXPECT_NE(report.find("    rank 2 was in train.cpp:57 (my::eval); every thread's stack: "
                        "/out/debug/rank2.stacks.txt\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("    rank 0 was in ddp::comm::Work::wait; every thread's stack: "
                        "/out/rank0.stacks.txt\n"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("rank 1 was in"), std::string::npos) << report;
}

// A record whose waiting_in is not what the writer writes is named with the field at fault.
TEST(Diagnose, ABadWaitingInIsNamed) {
  const std::string text = R"({"rank": 0, "world_size": 1, "reason": "", "time": 1, "phase": "",
    "last_issued": 0, "collectives": [], "waiting_in": {"function": "f", "file": "", "line": "x",
    "stacks_file": ""}})";
  try {
    ddp::comm::parse_flight_dump(text, "rank0.json");
    FAIL() << "parsed";
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank0.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("waiting_in"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
  }
}

}  // namespace
