// Every thread's stack (ddp/comm/diagnostics/stacks.h): a thread parked in a known function is
// walked and named with its function, file and line; the thread that asks is walked too; the choice
// of the program's own frame; a process started with real-time signals blocked, and an asking
// thread that blocks them; and the invariant that linking libunwind leaves C++ exceptions to
// libgcc. Compiled with debug info (tests/CMakeLists.txt), as a user's RelWithDebInfo build is.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/diagnostics/stacks.h"

namespace {

using ddp::stacks::Frame;
using ddp::stacks::ThreadStack;

constexpr const char* kNoStacks =
    "this build has no stack traces (configured with DDP_WITH_STACKS=OFF, or without "
    "libunwind-dev and libdw-dev)";

constexpr int kParkLine = __LINE__ + 4;  // the sleep in parked_here
[[gnu::noinline]] void parked_here(const std::atomic<bool>& parked, std::atomic<bool>& release) {
  const_cast<std::atomic<bool>&>(parked) = true;
  while (!release) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

TEST(Stacks, EveryThreadIsWalkedAndNamedWithItsFunctionFileAndLine) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  std::atomic<bool> parked{false}, release{false};
  std::thread worker([&] { parked_here(parked, release); });
  while (!parked) std::this_thread::yield();
  const auto threads = ddp::stacks::capture();
  release = true;
  worker.join();

  ASSERT_GE(threads.size(), 2u);
  EXPECT_TRUE(threads.front().main);
  const std::string text = ddp::stacks::format(threads);
  // The asking thread is the main one, in this test's body.
  bool asked_seen = false;
  for (const Frame& f : threads.front().frames) {
    asked_seen = asked_seen || f.function.find("EveryThreadIsWalked") != std::string::npos;
  }
  EXPECT_TRUE(asked_seen) << text;
  // The parked thread: its innermost own frame is the sleep's line in parked_here, below the
  // standard library's inlined sleep_for.
  const ThreadStack* parked_thread = nullptr;
  for (const auto& t : threads) {
    for (const Frame& f : t.frames) {
      if (f.function.find("parked_here") != std::string::npos) parked_thread = &t;
    }
  }
  ASSERT_NE(parked_thread, nullptr) << text;
  const auto own = ddp::stacks::innermost_own_frame(*parked_thread, ddp::stacks::executable_path());
  ASSERT_TRUE(own.has_value()) << text;
  EXPECT_NE(own->function.find("parked_here"), std::string::npos) << text;
  EXPECT_TRUE(ends_with(own->file, "tests/unit/test_stacks.cpp")) << own->file;
  EXPECT_EQ(own->line, kParkLine) << text;
  EXPECT_NE(text.find("sleep_for"), std::string::npos) << text;
  EXPECT_NE(text.find("(inlined)"), std::string::npos) << text;
}

// The first test again, in a process whose parent blocked the first real-time signals before
// starting it (some job runners do: the mask is inherited through exec, by every thread).
TEST(Stacks, AProcessStartedWithRealTimeSignalsBlockedStillWalksEveryThread) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  posix_spawnattr_t attr;
  ASSERT_EQ(posix_spawnattr_init(&attr), 0);
  sigset_t blocked;
  sigemptyset(&blocked);
  for (int sig = SIGRTMIN; sig <= SIGRTMIN + 4; ++sig) sigaddset(&blocked, sig);
  ASSERT_EQ(posix_spawnattr_setsigmask(&attr, &blocked), 0);
  ASSERT_EQ(posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK), 0);
  const std::string exe = ddp::stacks::executable_path();
  std::string filter =
      "--gtest_filter=Stacks.EveryThreadIsWalkedAndNamedWithItsFunctionFileAndLine";
  char* argv[] = {const_cast<char*>(exe.c_str()), filter.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, &attr, argv, environ), 0);
  posix_spawnattr_destroy(&attr);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the run above failed with the signals blocked";
}

// A thread that blocks every real-time signal asks: it is walked all the same, in its own code.
TEST(Stacks, TheAskingThreadIsWalkedWhereItBlocksTheSignals) {
  if (!ddp::stacks::supported()) GTEST_SKIP() << kNoStacks;
  std::vector<ThreadStack> threads;
  pid_t asker = 0;
  std::thread([&] {
    sigset_t all_rt;
    sigemptyset(&all_rt);
    for (int sig = SIGRTMIN; sig <= SIGRTMAX; ++sig) sigaddset(&all_rt, sig);
    pthread_sigmask(SIG_BLOCK, &all_rt, nullptr);
    asker = static_cast<pid_t>(::gettid());
    threads = ddp::stacks::capture();
  }).join();
  const ThreadStack* asking = nullptr;
  for (const auto& t : threads) {
    if (t.tid == asker) asking = &t;
  }
  ASSERT_NE(asking, nullptr) << ddp::stacks::format(threads);
  EXPECT_EQ(asking->error, "") << ddp::stacks::format(threads);
  bool in_test = false;
  for (const Frame& f : asking->frames) {
    in_test = in_test || f.function.find("TheAskingThreadIsWalked") != std::string::npos;
  }
  EXPECT_TRUE(in_test) << ddp::stacks::format(threads);
}

// The file of the object that defines `address`.
std::string object_of(const void* address) {
  Dl_info info{};
  return ::dladdr(address, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "";
}

// libunwind.so defines the _Unwind_* functions too; the build links libgcc_s first so that
// throwing a C++ exception keeps using GCC's unwinder (src/CMakeLists.txt).
TEST(Stacks, CxxExceptionsStillUseLibgccsUnwinder) {
  void* raise = ::dlsym(RTLD_DEFAULT, "_Unwind_RaiseException");
  ASSERT_NE(raise, nullptr);
  // Under clang's AddressSanitizer the program defines it itself, an interceptor that calls the
  // next definition: the one exceptions end in.
  if (object_of(raise) == object_of(reinterpret_cast<const void*>(&object_of))) {
    raise = ::dlsym(RTLD_NEXT, "_Unwind_RaiseException");
    ASSERT_NE(raise, nullptr);
  }
  EXPECT_NE(object_of(raise).find("libgcc_s"), std::string::npos) << object_of(raise);
}

Frame frame(std::string function, std::string file, int line, std::string object,
            bool inlined = false) {
  Frame f;
  f.function = std::move(function);
  f.file = std::move(file);
  f.line = line;
  f.object = std::move(object);
  f.inlined = inlined;
  return f;
}

TEST(Stacks, TheOwnFrameSkipsSystemHeadersAndLibrariesThenFallsBackToTheExecutable) {
  const std::string exe = "/home/me/build/train";
  ThreadStack t;
  t.frames = {frame("clock_nanosleep", "./nptl/clock_nanosleep.c", 48, "/usr/lib/libc.so.6"),
              frame("std::this_thread::sleep_for<>", "/usr/include/c++/12/bits/this_thread_sleep.h",
                    80, exe, true),
              frame("my_eval(int)", "/home/me/train.cpp", 57, exe),
              frame("main", "/home/me/main.cpp", 9, exe)};
  auto own = ddp::stacks::innermost_own_frame(t, exe);
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->function, "my_eval(int)");
  // A user library outside the system's directories counts; one under /usr/lib does not.
  t.frames.insert(t.frames.begin() + 1, frame("lib_f", "/home/me/lib.cpp", 3, "/home/me/libx.so"));
  t.frames.insert(t.frames.begin() + 1, frame("sys_f", "/build/z/z.c", 3, "/usr/lib/libz.so"));
  EXPECT_EQ(ddp::stacks::innermost_own_frame(t, exe)->function, "lib_f");
  // A program built with -ffile-prefix-map names its sources relative to its tree: they are its
  // own where the object is; glibc's are not, in a system library.
  ThreadStack mapped;
  mapped.frames = {frame("clock_nanosleep", "./nptl/clock_nanosleep.c", 48, "/usr/lib/libc.so.6"),
                   frame("my_eval(int)", "./src/train.cpp", 57, exe)};
  EXPECT_EQ(ddp::stacks::innermost_own_frame(mapped, exe)->function, "my_eval(int)");
  // Without debug info: the first frame of the executable with a symbol.
  ThreadStack bare;
  bare.frames = {frame("pthread_cond_wait", "", 0, "/usr/lib/libc.so.6"), frame("", "", 0, exe),
                 frame("ddp::Work::wait()", "", 0, exe)};
  EXPECT_EQ(ddp::stacks::innermost_own_frame(bare, exe)->function, "ddp::Work::wait()");
  // A standard library template the compiler instantiated in the program, not inlined (GCC 14 at
  // -O1 leaves std::future's wait out of line): the library's code, passed over.
  bare.frames.insert(bare.frames.begin() + 1,
                     frame("std::__basic_future<void>::_M_get_result() const", "", 0, exe));
  EXPECT_EQ(ddp::stacks::innermost_own_frame(bare, exe)->function, "ddp::Work::wait()");
  bare.frames.erase(bare.frames.begin() + 1);
  bare.frames.pop_back();
  EXPECT_FALSE(ddp::stacks::innermost_own_frame(bare, exe).has_value());
}

TEST(Stacks, FormatPrintsOneBlockPerThreadLikeADebugger) {
  ThreadStack t;
  t.tid = 42;
  t.name = "train";
  t.main = true;
  t.frames = {frame("f()", "/a/x.h", 3, "/bin/train", true),
              frame("g()", "/a/y.cpp", 7, "/bin/train"), frame("", "", 0, "/usr/lib/libc.so.6")};
  t.frames[0].pc = t.frames[1].pc = 0x1234;
  ThreadStack quiet;
  quiet.tid = 43;
  quiet.name = "io";
  quiet.error = "blocks signal 35: no stack";
  EXPECT_EQ(ddp::stacks::format({t, quiet}),
            "thread 42 \"train\" (main):\n"
            "  #0   0x0000000000001234 f() at /a/x.h:3 (inlined)\n"
            "  #1   0x0000000000001234 g() at /a/y.cpp:7 in train\n"
            "  #2   0x0000000000000000 ?? in libc.so.6\n"
            "\n"
            "thread 43 \"io\":\n"
            "  (blocks signal 35: no stack)\n"
            "\n");
}

}  // namespace
