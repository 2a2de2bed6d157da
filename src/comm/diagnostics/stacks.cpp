#include "ddp/comm/diagnostics/stacks.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#if DDP_HAVE_STACKS
#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <thread>
#endif

namespace ddp::stacks {

namespace {

// Where system and third-party files live: the standard library's and LibTorch's headers, the
// shared libraries of the distribution.
bool is_system_path(const std::string& path) {
  for (const char* prefix : {"/usr/", "/opt/", "/lib/", "/lib64/"}) {
    if (path.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

bool standard_library_symbol(const std::string& function) {
  for (const char* prefix : {"std::", "__gnu_cxx::", "void std::", "bool std::"}) {
    if (function.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

std::string executable_path() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : path.string();
}

std::optional<Frame> innermost_own_frame(const ThreadStack& thread, const std::string& executable) {
  for (const Frame& f : thread.frames) {
    // The object decides whose a relative source path is: a program built with
    // -ffile-prefix-map (Debian's build flags, reproducible builds, CI's cache) names its own
    // sources "./src/...", as a distribution's library names its own ("./nptl/..." in glibc,
    // under /usr/lib).
    const bool own_source = !f.file.empty() && !is_system_path(f.file);
    if (own_source && (f.object == executable || !is_system_path(f.object))) return f;
  }
  // Without debug info: the first symbol of the executable's that is not the standard library's
  // (a template of it instantiated in the program, as std::future's wait is where the compiler
  // did not inline it, is the library's code, not the program's).
  for (const Frame& f : thread.frames) {
    if (!executable.empty() && f.object == executable && !f.function.empty() &&
        !standard_library_symbol(f.function)) {
      return f;
    }
  }
  return std::nullopt;
}

std::string format(const std::vector<ThreadStack>& threads) {
  std::string out;
  for (const ThreadStack& t : threads) {
    out += fmt::format("thread {} \"{}\"{}:\n", t.tid, t.name, t.main ? " (main)" : "");
    if (!t.error.empty()) out += fmt::format("  ({})\n", t.error);
    for (size_t i = 0; i < t.frames.size(); ++i) {
      const Frame& f = t.frames[i];
      out += fmt::format("  #{:<3} 0x{:016x} {}", i, f.pc, f.function.empty() ? "??" : f.function);
      if (!f.file.empty()) out += fmt::format(" at {}:{}", f.file, f.line);
      if (f.inlined) {
        out += " (inlined)";
      } else if (!f.object.empty()) {
        out += " in " + std::filesystem::path(f.object).filename().string();
      }
      out += '\n';
    }
    out += '\n';
  }
  return out;
}

#if !DDP_HAVE_STACKS

bool supported() {
  return false;
}
std::vector<ThreadStack> capture() {
  return {};
}

#else

bool supported() {
  return true;
}

namespace {

// Note [One stack at a time]: a capture asks one thread at a time, through these globals, which
// the signal handler may touch (atomics, a semaphore, a plain array written before the post).
constexpr int kMaxFrames = 128;
constexpr pid_t kClaimed = -1;
std::atomic<pid_t> g_target{0};  // the thread asked; kClaimed once its handler has begun
uint64_t g_pcs[kMaxFrames];
std::atomic<int> g_count{0};
sem_t g_done;
int g_signal = 0;  // the real-time signal of the requests; 0 until installed
std::timed_mutex g_capture_mutex;
std::atomic<bool> g_broken{false};      // a thread began an answer and never finished it
thread_local bool t_capturing = false;  // this thread is inside capture() (a terminate handler's)

pid_t this_tid() {
  return static_cast<pid_t>(::syscall(SYS_gettid));
}

// Async-signal-safe: libunwind's local unwinding from the interrupted context, atomics and
// sem_post. A thread not asked (a late answer the capture gave up on) records nothing.
void on_stack_request(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  pid_t expected = this_tid();
  if (g_target.compare_exchange_strong(expected, kClaimed)) {
    int n = 0;
    unw_cursor_t cursor;
    if (unw_init_local2(&cursor, static_cast<unw_context_t*>(context), UNW_INIT_SIGNAL_FRAME) ==
        0) {
      do {
        unw_word_t pc = 0;
        if (unw_get_reg(&cursor, UNW_REG_IP, &pc) != 0 || pc == 0) break;
        g_pcs[n++] = pc;
      } while (n < kMaxFrames && unw_step(&cursor) > 0);
    }
    g_count.store(n);
    ::sem_post(&g_done);
  }
  errno = saved_errno;
}

// Whether `tid` blocks `sig` (SigBlk of its status): asking it would only wait for nothing.
bool blocks_signal(int tid, int sig) {
  std::ifstream in(fmt::format("/proc/self/task/{}/status", tid));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SigBlk:", 0) == 0) {
      const uint64_t mask = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (mask >> (sig - 1)) & 1U;
    }
  }
  return false;
}

// Whether `tid` keeps `sig` blocked. A mask seen blocked may be a moment's: glibc's
// pthread_create blocks every signal in the creating thread until the new one exists (the capture's
// own helper is started so), so it is read again a few times over 10 ms.
bool keeps_signal_blocked(int tid, int sig) {
  for (int look = 0; look < 5; ++look) {
    if (!blocks_signal(tid, sig)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The first real-time signal nobody handles (glibc keeps those below SIGRTMIN for itself) and
// the main thread does not block: a mask is inherited through fork and exec, and a process started
// with real-time signals blocked (some job runners do) passes that mask to every thread it starts.
// Installed once, kept. SA_RESTART: a system call the signal interrupts resumes where it can.
bool install_handler() {
  if (g_signal != 0) return true;
  for (int sig = SIGRTMIN + 1; sig <= SIGRTMAX; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    if (keeps_signal_blocked(::getpid(), sig)) continue;
    struct sigaction action {};
    action.sa_sigaction = on_stack_request;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    ::sigemptyset(&action.sa_mask);
    if (::sem_init(&g_done, 0, 0) != 0 || ::sigaction(sig, &action, nullptr) != 0) return false;
    g_signal = sig;
    return true;
  }
  return false;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<int> thread_ids() {
  std::vector<int> tids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    tids.push_back(std::atoi(entry.path().filename().c_str()));
  }
  std::sort(tids.begin(), tids.end());
  return tids;
}

// The addresses of `tid`'s stack, or an error; a thread that has not answered in `patience` is
// given up on (it may be stopped, or in the kernel without a way out). `asker`: the thread that
// asked for the capture, which unblocked the signal (a moment's mask aside: the signal then waits,
// pending, until it is restored).
std::vector<uint64_t> walk_thread(int tid, bool asker, std::string& error) {
  constexpr long kPatienceNs = 500'000'000;
  if (!asker && keeps_signal_blocked(tid, g_signal)) {
    error = fmt::format("blocks signal {}: no stack", g_signal);
    return {};
  }
  while (::sem_trywait(&g_done) == 0) {
  }
  g_target.store(tid);
  if (::syscall(SYS_tgkill, ::getpid(), tid, g_signal) != 0) {
    g_target.store(0);
    error = "ended before its stack was taken";
    return {};
  }
  timespec deadline{};
  ::clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_nsec += kPatienceNs;
  deadline.tv_sec += deadline.tv_nsec / 1'000'000'000;
  deadline.tv_nsec %= 1'000'000'000;
  while (::sem_timedwait(&g_done, &deadline) != 0) {
    if (errno == EINTR) continue;
    pid_t expected = tid;
    if (g_target.compare_exchange_strong(expected, 0)) {  // not begun: never will
      error = "did not answer within 0.5 s";
      return {};
    }
    // Begun: it finishes soon, unless the thread was stopped inside the handler. Then its late
    // answer could overwrite a later capture's addresses: no capture is taken any more.
    deadline.tv_sec += 1;
    while (::sem_timedwait(&g_done, &deadline) != 0) {
      if (errno == EINTR) continue;
      g_broken.store(true);
      error = "began its answer and did not finish it within 1.5 s";
      return {};
    }
    break;
  }
  g_target.store(0);
  return std::vector<uint64_t>(g_pcs, g_pcs + g_count.load());
}

std::string demangled(const char* name) {
  if (name == nullptr) return "";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

// A function's name from its DWARF entry (an inlined instance refers to its abstract origin).
std::string die_function_name(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dwarf_attr_integrate(die, name, &attr) != nullptr) {
      if (const char* s = dwarf_formstring(&attr)) return demangled(s);
    }
  }
  if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
    if (const char* s = dwarf_formstring(&attr)) return s;
  }
  return "";
}

// Note [Debug files from this machine only]: libdw's standard lookup
// (dwfl_standard_find_debuginfo) asks the debuginfod servers of DEBUGINFOD_URLS for what it does
// not find on disk, and Debian sets that variable in login shells; a capture taken while a job
// hangs would then wait on the network, holding the watchdog. This lookup reads the disk only, in
// the standard's order: by build ID under /usr/lib/debug (Debian's -dbg and -dbgsym packages),
// then the .gnu_debuglink name beside the file, in its .debug/, under /usr/lib/debug. (A file's own
// DWARF is used before any of these are asked, by libdwfl.)
int open_local_debuginfo(Dwfl_Module* module, void** /*userdata*/, const char* /*name*/,
                         Dwarf_Addr /*base*/, const char* file_name, const char* debuglink,
                         GElf_Word /*crc*/, char** found) {
  static constexpr const char* kDebugRoot = "/usr/lib/debug";
  std::vector<std::string> candidates;
  const unsigned char* id = nullptr;
  GElf_Addr id_address = 0;
  const int id_size = dwfl_module_build_id(module, &id, &id_address);
  if (id_size > 1) {
    std::string hex;
    for (int i = 0; i < id_size; ++i) hex += fmt::format("{:02x}", id[i]);
    candidates.push_back(
        fmt::format("{}/.build-id/{}/{}.debug", kDebugRoot, hex.substr(0, 2), hex.substr(2)));
  }
  if (debuglink != nullptr && debuglink[0] == '/') {
    candidates.emplace_back(debuglink);
  } else if (debuglink != nullptr && file_name != nullptr) {
    const std::string dir = std::filesystem::path(file_name).parent_path().string();
    for (const std::string& d : {dir, dir + "/.debug", std::string(kDebugRoot) + dir}) {
      candidates.push_back(d + "/" + debuglink);
    }
  }
  for (const std::string& path : candidates) {
    if (file_name != nullptr && path == file_name) continue;  // a debuglink naming the file itself
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    *found = ::strdup(path.c_str());
    return fd;
  }
  errno = ENOENT;
  return -1;
}

class Symbolizer {
 public:
  Symbolizer() : dwfl_(dwfl_begin(&kCallbacks)) {
    if (dwfl_ == nullptr) return;
    dwfl_report_begin(dwfl_);
    dwfl_linux_proc_report(dwfl_, ::getpid());
    dwfl_report_end(dwfl_, nullptr, nullptr);
  }
  ~Symbolizer() {
    if (dwfl_ != nullptr) dwfl_end(dwfl_);
  }
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // The frames at `pc`: the inlined functions there, innermost first, then the function that
  // holds the code. `return_address`: pc follows a call, whose own line is the one before.
  std::vector<Frame> frames_at(uint64_t pc, bool return_address) const {
    Frame outer;
    outer.pc = pc;
    const Dwarf_Addr addr = return_address ? pc - 1 : pc;
    Dwfl_Module* module = dwfl_ == nullptr ? nullptr : dwfl_addrmodule(dwfl_, addr);
    if (module == nullptr) return {outer};
    const char* object =
        dwfl_module_info(module, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    outer.object = object != nullptr ? object : "";
    outer.function = demangled(dwfl_module_addrname(module, addr));
    if (Dwfl_Line* line = dwfl_module_getsrc(module, addr)) {
      if (const char* file = dwfl_lineinfo(line, nullptr, &outer.line, nullptr, nullptr, nullptr)) {
        outer.file = file;
      }
    }
    return with_inlined(module, addr, std::move(outer));
  }

 private:
  // Splits `outer` (the innermost line, the symbol's name) along the inlined calls at `addr`:
  // each inlined function gets the innermost line, or its callee's call site.
  static std::vector<Frame> with_inlined(Dwfl_Module* module, Dwarf_Addr addr, Frame outer) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(module, addr, &bias);
    Dwarf_Die* scopes = nullptr;
    const int n = cu == nullptr ? 0 : dwarf_getscopes(cu, addr - bias, &scopes);
    Dwarf_Files* files = nullptr;
    size_t file_count = 0;
    if (n > 0) dwarf_getsrcfiles(cu, &files, &file_count);
    std::vector<Frame> frames;
    Frame current = outer;  // the innermost line, its function named below
    for (int i = 0; i < n; ++i) {
      if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine) continue;
      current.function = die_function_name(&scopes[i]);
      current.inlined = true;
      frames.push_back(current);
      // The caller's line is where this one was inlined.
      Dwarf_Attribute attr;
      Dwarf_Word file_index = 0, line = 0;
      current.file.clear();
      current.line = 0;
      if (files != nullptr &&
          dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &file_index) == 0 &&
          file_index < file_count) {
        if (const char* file = dwarf_filesrc(files, file_index, nullptr, nullptr)) {
          current.file = file;
        }
      }
      if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attr), &line) == 0) {
        current.line = static_cast<int>(line);
      }
    }
    std::free(scopes);
    current.function = outer.function;
    current.inlined = false;
    frames.push_back(current);
    return frames;
  }

  static inline char* debuginfo_path_ = nullptr;
  static inline const Dwfl_Callbacks kCallbacks = {dwfl_linux_proc_find_elf, open_local_debuginfo,
                                                   nullptr, &debuginfo_path_};
  Dwfl* dwfl_;
};

// `sig` unblocked on the calling thread for this object's life, its mask as it was after.
class SignalUnblocked {
 public:
  explicit SignalUnblocked(int sig) {
    sigset_t set;
    ::sigemptyset(&set);
    ::sigaddset(&set, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &set, &before_);
  }
  ~SignalUnblocked() { ::pthread_sigmask(SIG_SETMASK, &before_, nullptr); }
  SignalUnblocked(const SignalUnblocked&) = delete;
  SignalUnblocked& operator=(const SignalUnblocked&) = delete;

 private:
  sigset_t before_{};
};

// What capture() does, on a thread of its own, so that the thread that called it is walked too.
std::vector<ThreadStack> capture_from_helper(pid_t asker) {
  const pid_t helper = this_tid();
  std::vector<std::vector<uint64_t> > walked;  // threads[i]'s addresses
  std::vector<ThreadStack> threads;
  for (int tid : thread_ids()) {
    if (tid == helper) continue;
    ThreadStack t;
    t.tid = tid;
    t.main = tid == ::getpid();
    t.name = read_first_line(fmt::format("/proc/self/task/{}/comm", tid));
    walked.push_back(walk_thread(tid, tid == asker, t.error));
    threads.push_back(std::move(t));
  }
  // Symbolized after every thread was walked: the threads are held up no longer than needed.
  const Symbolizer symbolizer;
  for (size_t i = 0; i < threads.size(); ++i) {
    const auto& pcs = walked[i];
    for (size_t k = 0; k < pcs.size(); ++k) {
      // The first address is the interrupted instruction; the others are return addresses.
      for (Frame& f : symbolizer.frames_at(pcs[k], k > 0)) threads[i].frames.push_back(f);
    }
  }
  std::stable_partition(threads.begin(), threads.end(),
                        [](const ThreadStack& t) { return t.main; });
  return threads;
}

}  // namespace

// Note [A capture never waits long]: it runs where a job is failing (a watchdog before a
// timeout, the terminate handler, a SIGUSR1 request), so each wait has a deadline: another
// capture for 5 s, each thread's answer as in walk_thread; and a capture asked for on a thread
// that is already capturing (a terminate handler running on the watchdog mid-capture) returns
// none at once instead of waiting for itself.
std::vector<ThreadStack> capture() {
  if (t_capturing || g_broken.load()) return {};
  try {
    std::unique_lock<std::timed_mutex> lock(g_capture_mutex, std::chrono::seconds(5));
    if (!lock.owns_lock() || !install_handler()) return {};
    t_capturing = true;
    struct Done {
      ~Done() { t_capturing = false; }
    } done;
    std::vector<ThreadStack> threads;
    // The asking thread waits in join() below and is walked like the others; it takes the
    // signal meanwhile even where its own mask blocks it.
    const SignalUnblocked unblocked(g_signal);
    std::thread helper([&threads, asker = this_tid()] {
      try {
        threads = capture_from_helper(asker);
      } catch (const std::exception&) {  // out of memory, most likely: no stacks
      }
    });
    helper.join();
    return threads;
  } catch (const std::exception&) {  // a thread that cannot start: no stacks, as promised
    return {};
  }
}

#endif

}  // namespace ddp::stacks
