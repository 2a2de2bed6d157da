#include "warm_spare.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "ddp/common/error.h"
#include "exec_args.h"
#include "options.h"

namespace ddp::launch {
namespace {

// A fork takes milliseconds; a spare that takes this long to answer is stuck.
constexpr int kAnswerWithinMs = 5000;

}  // namespace

WarmSpare::WarmSpare(const std::string& program, const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env) {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    throw Error(fmt::format("--warm-spare: cannot make the launcher a child subreaper: {}",
                            std::strerror(errno)));
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    throw Error(fmt::format("--warm-spare: socketpair: {}", std::strerror(errno)));
  }
  client_ = std::make_unique<spare::Client>(fds[0]);
  std::map<std::string, std::string> spare_env = env;
  spare_env[spare::kFdVariable] = std::to_string(fds[1]);
  const ExecArgs exec(argv, spare_env);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(fds[1]);
    throw Error(fmt::format("--warm-spare: fork: {}", std::strerror(errno)));
  }
  if (pid_ == 0) {
    ::setpgid(0, 0);  // no signal to the launcher's group reaches it
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    ::fcntl(fds[1], F_SETFD, 0);  // the one descriptor the spare keeps across exec
    std::signal(SIGPIPE, SIG_DFL);
    ::execve(program.c_str(), exec.argv(), exec.envp());
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);
  ::close(fds[1]);
}

WarmSpare::~WarmSpare() {
  client_.reset();  // its socket closed, as at the launcher's death
  if (!reaped_) {
    ::kill(-pid_, SIGKILL);
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
  }
}

std::optional<pid_t> WarmSpare::fork_worker(const std::map<std::string, std::string>& env,
                                            int out_fd) {
  if (!gone().empty()) return std::nullopt;
  return client_->fork_worker(env, out_fd, kAnswerWithinMs);
}

std::string WarmSpare::gone() {
  client_->ready();  // reads its word, if any
  if (!reaped_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  if (!reaped_) return client_->why();
  return fmt::format("it ended, {}{}", describe_status(status_),
                     client_->why().empty() ? "" : ": " + client_->why());
}

}  // namespace ddp::launch
