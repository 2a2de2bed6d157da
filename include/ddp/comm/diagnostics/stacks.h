#pragma once
// Every thread's stack, symbolized, as a debugger's `thread apply all bt` shows it, without a
// debugger: what the hang doctor writes beside a rank's flight record, so that "rank 2 was in
// train.cpp:57 (my_eval)" can be said of a rank that never entered a collective.
//
// Two libraries, one job each: libunwind walks each thread's stack in-process from a signal
// handler (its unw_init_local2 starts at the interrupted instruction); libdw (elfutils) turns the
// addresses into functions, inlined ones included, with source file and line where debug info
// exists, as eu-stack does. libdw alone cannot walk this process's own threads (its unwinder
// attaches with ptrace), and libunwind has no line tables.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::stacks {

struct Frame {
  uint64_t pc = 0;
  std::string function;  // demangled; "" when no symbol covers pc
  std::string file;      // the source file; "" without debug info
  int line = 0;
  std::string object;    // the ELF file that holds the code (the executable, a shared library)
  bool inlined = false;  // inlined into the next (outer) frame, which has the same pc
};

struct ThreadStack {
  int tid = 0;
  std::string name;           // /proc/self/task/<tid>/comm
  bool main = false;          // the process's first thread (tid == pid)
  std::vector<Frame> frames;  // innermost first
  std::string error;          // why `frames` is empty (the thread blocks the signal, ...)
};

// Whether this build can capture stacks: it found libunwind and libdw when it was configured.
bool supported();

// Every thread's stack now, the main thread first. Interrupts each thread for the time its
// stack takes to walk (a real-time signal whose handler only records addresses); symbolizes
// afterwards from this machine's files only, never a debuginfod server. Callable from any
// thread (itself included) but not from a signal handler; one capture at a time, a second
// waiting at most 5 s for the first; on a thread already capturing it returns none at once.
// Never throws: a failure is in the result (an empty vector where unsupported or given up, a
// thread's `error`).
std::vector<ThreadStack> capture();

// One block per thread, innermost frame first:
//   thread 1234 "ddp_train" (main):
//     #0  0x00007f2a0c3e4e2b clock_nanosleep in libc.so.6
//     #1  0x000055d0e1a0b3f1 std::this_thread::sleep_for<...> at /usr/include/c++/12/...:121
//     (inlined) #2  0x000055d0e1a0b3f1 my_eval(int) at /home/me/train.cpp:57 in train
std::string format(const std::vector<ThreadStack>& threads);

// The innermost frame of the program's own code (the user's or ddp's) on `thread`: the first
// frame with a source path outside /usr/, /opt/, /lib/ (where system and third-party headers
// live: the standard library's, LibTorch's; a relative one, as -ffile-prefix-map writes, counts)
// whose code is in `executable` or in a library outside those directories; else the first frame
// whose code is in `executable` (a build without debug info still has its symbols), the standard
// library's templates instantiated there passed over. Pure.
std::optional<Frame> innermost_own_frame(const ThreadStack& thread, const std::string& executable);

// The path of the running executable (/proc/self/exe), "" when unreadable.
std::string executable_path();

}  // namespace ddp::stacks
