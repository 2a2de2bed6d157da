#pragma once
// Runs programs for tests: real processes, with a time limit, so a test can never hang.

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ddp::testing {

struct ProcessResult {
  int exit_code = -1;  // exit status, or 128 + signal when killed by a signal
  bool timed_out = false;
  std::string output;  // stdout and stderr, interleaved
};

// Runs argv[0] with `argv`, extra `env` on top of this process's environment, in its own process
// group. After `timeout` the whole group is killed (SIGKILL) and timed_out is set.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A process started in the background, in its own process group, output to a file.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  ~Child();  // kills the group if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Waits until `deadline`; past it the group is killed and timed_out set.
  ProcessResult wait_until(std::chrono::steady_clock::time_point deadline);
  void kill_group();
  int pid() const { return pid_; }
  // The output so far.
  std::string output() const;
  // Waits until the output contains `text`; false when `deadline` passes first.
  bool wait_for_output(const std::string& text,
                       std::chrono::steady_clock::time_point deadline) const;

 private:
  int pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

// The pid the launcher reported for `rank` ("[launcher] rank 1: pid 1234") in its output; -1.
int launcher_worker_pid(const std::string& launcher_output, int rank);

// Whether process `pid` exists (a zombie counts); false for pid <= 0.
bool process_alive(int pid);

// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range (so that
// no connection another test opens takes it meanwhile).
int free_port();

// A fresh empty directory under the system temp dir; removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `contents` to `path` (binary).
void write_file(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);

}  // namespace ddp::testing
