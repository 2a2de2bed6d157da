#include "subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ddp::testing {

namespace {

std::string child_log_path() {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("ddp-child-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log"))
      .string();
}

}  // namespace

Child::Child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env)
    : log_path_(child_log_path()) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    const int null_fd = open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a kill cannot race the child's own setpgid
  pid_ = pid;
}

Child::~Child() {
  if (!reaped_) {
    kill_group();
    waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove(log_path_, ec);
}

void Child::kill_group() {
  kill(-pid_, SIGKILL);
}

std::string Child::output() const {
  return read_file(log_path_);
}

bool Child::wait_for_output(const std::string& text,
                            std::chrono::steady_clock::time_point deadline) const {
  while (output().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

ProcessResult Child::wait_until(std::chrono::steady_clock::time_point deadline) {
  ProcessResult result;
  int status = 0;
  while (true) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill_group();
      waitpid(pid_, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reaped_ = true;
  kill(-pid_, SIGKILL);  // whatever the leader left behind in its group goes too
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  result.output = read_file(log_path_);
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds timeout) {
  Child child(argv, env);
  return child.wait_until(std::chrono::steady_clock::now() + timeout);
}

int launcher_worker_pid(const std::string& output, int rank) {
  std::smatch m;
  const std::regex line("\\[launcher\\] rank " + std::to_string(rank) + ": pid ([0-9]+)");
  return std::regex_search(output, m, line) ? std::stoi(m[1]) : -1;
}

bool process_alive(int pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno != ESRCH);
}

namespace {

// The first port of the kernel's ephemeral range (what bind to port 0 and every connect() take
// from), 32768 where it cannot be read.
int ephemeral_floor() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  return low;
}

bool bindable(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

// Whether this process now holds `port` against every other test process: an flock on a file
// named after it, held until this process exits (the kernel drops it then, however it ends). The
// same process never gets a port twice either (a second open file's lock conflicts with the
// first), so no job of a test meets an earlier job's TIME_WAIT.
bool reserve(int port) {
  const char* dir = "/tmp/ddp-test-ports";
  ::mkdir(dir, 01777);
  ::chmod(dir, 01777);  // mkdir's mode passes through the umask
  const std::string path = std::string(dir) + "/" + std::to_string(port);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return true;  // an unwritable /tmp: chance alone keeps tests apart, as before
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;  // fd stays open: the lock with it
  ::close(fd);
  return false;
}

// Below the ephemeral range: a port the kernel handed out there could be taken, between this
// check and the rank's bind, by any connection another test opens meanwhile (gloo's ranks open
// many), which made a rank's store fail with "MASTER_PORT ... is already in use". Tests choose
// at random among 10000 ports, each process from its own seed, and reserve what they chose:
// two tests that ctest runs at once drew the same port often enough to fail a CI run in twenty.
int free_port() {
  static std::minstd_rand next(static_cast<unsigned>(::getpid()) ^
                               static_cast<unsigned>(std::time(nullptr)));
  const int high = std::max(ephemeral_floor(), 11024);  // a floor of 1024 leaves none below
  const int low = std::max(1024, high - 10000);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = low + static_cast<int>(next() % static_cast<unsigned>(high - low));
    if (reserve(port) && bindable(port)) return port;
  }
  throw std::runtime_error("free_port: no free port below the ephemeral range");
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "ddp-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ddp::testing
