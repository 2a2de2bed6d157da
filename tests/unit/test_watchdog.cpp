// The watchdog's terminate handler (src/comm/diagnostics/watchdog.cpp) when the watchdog's own
// thread is the one that terminates, in the middle of taking every thread's stacks: the handler, on
// that same thread, must not wait for the capture it is itself inside. Death tests: each runs in a
// child.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "ddp/comm/diagnostics/diagnose.h"
#include "ddp/comm/diagnostics/stacks.h"
#include "ddp/comm/diagnostics/watchdog.h"
#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/rendezvous.h"
#include "subprocess.h"

namespace {

std::set<int> thread_ids() {
  std::set<int> tids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    tids.insert(std::stoi(entry.path().filename().string()));
  }
  return tids;
}

// The first thread of `now` not in `known`, or 0.
int new_thread(const std::set<int>& known, const std::set<int>& now) {
  for (int tid : now) {
    if (known.count(tid) == 0) return tid;
  }
  return 0;
}

// A world of one with a watchdog writing to `record`; a SIGUSR1 request makes it take the stacks
// (on a helper thread it starts); as soon as that helper exists, the watchdog's thread is made to
// terminate (SIGUSR2, whose handler calls std::terminate: the test's stand-in for an exception
// nobody catches there). The terminate handler writes the record and aborts.
[[noreturn]] void terminate_the_watchdog_mid_capture(const std::string& record) {
  auto group = ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
  const auto before = thread_ids();
  ddp::comm::WatchdogOptions options;
  options.dump_path = record;
  options.progress_interval = std::chrono::milliseconds(20);
  ddp::comm::Watchdog watchdog(std::move(group), options);
  const auto with_watchdog = thread_ids();
  const int watchdog_tid = new_thread(before, with_watchdog);
  ::signal(SIGUSR2, [](int) { std::terminate(); });
  ddp::comm::request_flight_dump_from_signal();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (new_thread(with_watchdog, thread_ids()) != 0) {
      ::syscall(SYS_tgkill, ::getpid(), watchdog_tid, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::seconds(20));  // the abort comes first
    }
  }
  std::_Exit(3);  // the capture's helper never came
}

TEST(WatchdogDeathTest, TerminatingOnItsOwnThreadMidCaptureWritesTheRecordAndAborts) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << "this build has no stack traces to take";
  ddp::testing::TempDir out;
  const std::string record = out.file("debug/rank0.json");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EXIT(terminate_the_watchdog_mid_capture(record), ::testing::KilledBySignal(SIGABRT), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  ASSERT_TRUE(std::filesystem::exists(record));
  const auto dump = ddp::comm::parse_flight_dump(ddp::testing::read_file(record), record);
  EXPECT_EQ(dump.reason, "terminate: no exception");
}

}  // namespace
