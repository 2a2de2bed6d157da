#include "ddp/common/fork_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/common/socket.h"

namespace ddp::spare {
namespace {

constexpr size_t kMaxMessage = 1 << 20;  // an environment of a few KB; far more is no request
constexpr const char* kReady = "ready";
constexpr const char* kPid = "pid ";
constexpr const char* kError = "error ";
// How long the worker waits to become the launcher's child (the middle process's exit), checking
// every millisecond: far longer than an exit takes.
constexpr int kReparentTries = 5000;

// One message, with the descriptors it carries (none, or a request's two).
struct Message {
  std::string text;
  std::vector<int> fds;
};

// A request carries the worker's output pipe and the go-ahead pipe, in that order.
constexpr size_t kOut = 0;
constexpr size_t kGo = 1;
constexpr size_t kRequestFds = 2;

void close_all(const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
}

void send_message(int fd, const std::string& text, const std::vector<int>& carried = {}) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kRequestFds * sizeof(int))] = {};
  if (!carried.empty()) {
    const size_t bytes = carried.size() * sizeof(int);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(bytes);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(bytes);
    std::memcpy(CMSG_DATA(c), carried.data(), bytes);
  }
  ssize_t n;
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(text.size())) {
    throw Error(fmt::format("warm spare: cannot send a message: {}", net::errno_text()));
  }
}

Message receive_message(int fd) {
  std::string buffer(kMaxMessage, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kRequestFds * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) throw Error(fmt::format("warm spare: cannot receive: {}", net::errno_text()));
  Message m;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    m.fds.resize((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    std::memcpy(m.fds.data(), CMSG_DATA(c), m.fds.size() * sizeof(int));
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    close_all(m.fds);
    throw Error("warm spare: a message longer than the protocol allows");
  }
  buffer.resize(static_cast<size_t>(n));
  m.text = std::move(buffer);
  return m;
}

// The forked worker's set-up, before it returns from serve() (the spare has one thread, serve()
// checked, so the worker may allocate). It goes on only once the launcher, holding its pid, says
// so on the go-ahead pipe: a spare that died before it answered leaves a worker the launcher does
// not know, which ends here at the pipe's end instead of joining beside the one the launcher
// starts anew.
void become_worker(const Message& request, pid_t launcher) {
  ::setpgid(0, 0);  // its own group: the launcher signals it and its children together
  for (int i = 0; ::getppid() != launcher; ++i) {
    if (i == kReparentTries) ::_exit(127);  // the launcher is gone, or is no subreaper
    ::usleep(1000);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);         // dies with the launcher, even by SIGKILL
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
  char go = 0;
  ssize_t n;
  do n = ::read(request.fds[kGo], &go, 1);
  while (n < 0 && errno == EINTR);
  if (n != 1) ::_exit(127);
  ::close(request.fds[kGo]);
  ::dup2(request.fds[kOut], STDOUT_FILENO);
  ::dup2(request.fds[kOut], STDERR_FILENO);
  ::close(request.fds[kOut]);
  ::clearenv();
  // putenv keeps the strings themselves: they live as long as the process.
  for (const auto& [key, value] : decode_env(request.text)) {
    ::putenv(::strdup((key + "=" + value).c_str()));
  }
}

// Forks the worker for `request`, through a middle process that exits at once; returns the
// worker's pid in the spare (-1 and errno when a fork failed) and 0 in the worker.
pid_t fork_twice(const Message& request, int socket, pid_t launcher) {
  int pid_pipe[2];
  if (::pipe2(pid_pipe, O_CLOEXEC) != 0) return -1;
  std::fflush(nullptr);  // nothing buffered in the spare is written twice
  const pid_t middle = ::fork();
  if (middle == 0) {
    const pid_t worker = ::fork();
    if (worker == 0) {
      ::close(pid_pipe[0]);
      ::close(pid_pipe[1]);
      ::close(socket);
      become_worker(request, launcher);
      return 0;
    }
    [[maybe_unused]] const ssize_t n = ::write(pid_pipe[1], &worker, sizeof worker);
    ::_exit(worker < 0 ? 1 : 0);
  }
  ::close(pid_pipe[1]);
  pid_t worker = -1;
  if (middle > 0) {
    if (::read(pid_pipe[0], &worker, sizeof worker) != sizeof worker) worker = -1;
    int status = 0;
    while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::close(pid_pipe[0]);
  return worker;
}

// The threads of this process: a fork copies only the calling one, so the spare must have no other
// (one holding a lock at the fork would leave it held in the worker for ever).
size_t threads_of_this_process() {
  std::error_code ec;
  size_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return n;
}

}  // namespace

std::string encode_env(const std::map<std::string, std::string>& env) {
  std::string out;
  for (const auto& [key, value] : env) {
    out += key;
    out += '=';
    out += value;
    out += '\0';
  }
  return out;
}

std::map<std::string, std::string> decode_env(const std::string& message) {
  std::map<std::string, std::string> env;
  size_t begin = 0;
  while (begin < message.size()) {
    size_t end = message.find('\0', begin);
    if (end == std::string::npos) end = message.size();
    const std::string entry = message.substr(begin, end - begin);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(fmt::format("warm spare: '{}' is no environment entry (KEY=value)", entry));
    }
    env[entry.substr(0, eq)] = entry.substr(eq + 1);
    begin = end + 1;
  }
  return env;
}

std::optional<int> spare_fd_from_env() {
  const char* value = std::getenv(kFdVariable);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  const long fd = std::strtol(value, &end, 10);
  struct stat st {};
  if (end == value || *end != '\0' || fd < 0 || fd > INT32_MAX ||
      ::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    throw Error(
        fmt::format("{}={}: names no socket this process holds (the launcher's "
                    "--warm-spare sets it)",
                    kFdVariable, value));
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // never a worker's
  return static_cast<int>(fd);
}

void serve(int fd) {
  const pid_t launcher = ::getppid();
  if (const size_t threads = threads_of_this_process(); threads != 1) {
    send_message(fd, fmt::format("{}the spare runs {} threads, and only a process of one can "
                                 "fork safely",
                                 kError, threads));
    ::_exit(1);
  }
  send_message(fd, kReady);
  while (true) {
    const Message request = receive_message(fd);
    if (request.text.empty()) ::_exit(0);  // the launcher closed its end: the job is over
    std::string answer;
    if (request.fds.size() != kRequestFds) {
      answer = std::string(kError) + "a request without the worker's two pipes";
    } else {
      try {
        decode_env(request.text);  // refused here, not in a worker that cannot say why
        const pid_t worker = fork_twice(request, fd, launcher);
        if (worker == 0) return;  // the worker
        answer = worker > 0 ? fmt::format("{}{}", kPid, worker)
                            : std::string(kError) + "fork: " + net::errno_text();
      } catch (const Error& e) {
        answer = std::string(kError) + e.what();
      }
    }
    close_all(request.fds);
    send_message(fd, answer);
  }
}

Client::~Client() {
  ::close(fd_);
}

void Client::gone(std::string why) {
  ready_ = false;
  if (why_.empty()) why_ = std::move(why);
}

bool Client::ready() {
  if (ready_ || !why_.empty()) return ready_;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  try {
    const Message m = receive_message(fd_);
    close_all(m.fds);
    if (m.text == kReady) {
      ready_ = true;
    } else {
      gone(m.text.empty() ? "it ended before it was ready" : "it said '" + m.text + "'");
    }
  } catch (const Error& e) {
    gone(e.what());
  }
  return ready_;
}

std::optional<pid_t> Client::fork_worker(const std::map<std::string, std::string>& env, int out_fd,
                                         int timeout_ms) {
  if (!ready()) return std::nullopt;
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) {
    gone(fmt::format("pipe: {}", net::errno_text()));
    return std::nullopt;
  }
  const net::UniqueFd go_ahead(go[1]);  // closed unwritten, it tells a worker to end
  const std::optional<pid_t> pid = ask(env, {out_fd, go[0]}, timeout_ms);
  ::close(go[0]);
  if (!pid) return std::nullopt;
  // A worker that died already (EPIPE: the launcher ignores SIGPIPE) is reaped as any lost one.
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(go_ahead.get(), &byte, 1);
  return pid;
}

std::optional<pid_t> Client::ask(const std::map<std::string, std::string>& env,
                                 const std::vector<int>& fds, int timeout_ms) {
  try {
    send_message(fd_, encode_env(env), fds);
    pollfd p{fd_, POLLIN, 0};
    int polled;
    do polled = ::poll(&p, 1, timeout_ms);
    while (polled < 0 && errno == EINTR);
    if (polled == 0) {
      gone(fmt::format("no answer within {} ms", timeout_ms));
      return std::nullopt;
    }
    const Message m = receive_message(fd_);
    close_all(m.fds);
    if (m.text.rfind(kPid, 0) == 0) {
      const long pid = std::strtol(m.text.c_str() + std::strlen(kPid), nullptr, 10);
      if (pid > 0) return static_cast<pid_t>(pid);
    }
    gone(m.text.empty() ? "it ended" : "it said '" + m.text + "'");
  } catch (const Error& e) {
    gone(e.what());
  }
  return std::nullopt;
}

}  // namespace ddp::spare
