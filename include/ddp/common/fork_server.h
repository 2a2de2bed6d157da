#pragma once
// A warm spare's protocol, both ends: the launcher's (--warm-spare) and the program's (ddp_train).
//
// Note [A replacement forked from a warm spare]
// A restarted elastic worker is a new process: the dynamic loading of LibTorch and its hundreds
// of libraries, the data read and decoded, the model built, about 1 CPU s on the 2-core machine
// (docs/benchmarks.md, "A storm of faults"), taken from the survivors that share the cores. With
// --warm-spare the launcher starts one more copy of the program, which does all that once, says
// it is ready, and then forks a worker for each replacement the launcher asks for. The fork shares
// the loaded pages (copy on write): a replacement costs a fork and its own set-up (threads, the
// group, the state it is sent), not a process's start.
// - A fork copies only the calling thread, so the spare makes its workload on one thread and
//   refuses to serve when it runs more than one (an OpenMP pool forked half-way would hang the
//   worker's first parallel region); the worker sets its threads as any worker does.
// - The worker must be the launcher's child, for the launcher waits on it: the spare forks twice
//   and the middle process exits at once, so the worker is re-parented to the launcher, which made
//   itself a child subreaper (prctl(2)). The spare answers only once the middle one ended, and the
//   worker waits until the launcher is its parent before asking to die with it (PR_SET_PDEATHSIG).
// - The worker's environment is replaced by the one the launcher sends (its rank, rendezvous and
//   elastic id), before anything reads it; its output goes to the pipe the launcher sent.
// - The spare's environment has the job's WORLD_SIZE but no RANK: a program that does not know
//   the protocol fails at its rendezvous (torchrun's contract needs both) instead of joining the
//   job or training alone, and the launcher, never told "ready", starts replacements as new
//   processes, as it does whenever the spare cannot fork.
//
// The messages, over a socketpair(AF_UNIX, SOCK_SEQPACKET), one a request or an answer:
// - spare -> launcher: "ready", once its loading is done (or "error <why>", and it exits);
// - launcher -> spare: the worker's whole environment ("KEY=value" strings, NUL-separated), with
//   the write end of the worker's output pipe and the read end of a go-ahead pipe as SCM_RIGHTS;
// - spare -> launcher: "pid <n>" (the worker, already the launcher's child) or "error <why>";
// - launcher -> worker: one byte on the go-ahead pipe once it holds the pid. A spare that died
//   between its fork and its answer leaves a worker the launcher never heard of, and starts the
//   same worker anew: that one reads the pipe's end instead, and exits.

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::spare {

// The variable that names the spare's end of the socketpair in the spare's environment.
inline constexpr const char* kFdVariable = "DDP_WARM_SPARE_FD";

// The environment as one message: "KEY=value" strings, each followed by a NUL.
std::string encode_env(const std::map<std::string, std::string>& env);
// Its inverse; throws Error on a message that is not one (an entry without '=').
std::map<std::string, std::string> decode_env(const std::string& message);

// The spare's end (in the program): the socket named by kFdVariable, or nullopt when the
// variable is not set (the program runs as a worker). Throws Error when it names no socket.
std::optional<int> spare_fd_from_env();

// In the spare, once loaded: says "ready", then serves the launcher's requests. Returns only in
// a forked worker, with the environment the launcher sent (clearenv, then each entry), stdout
// and stderr on the pipe it sent, its own process group, and SIGKILL when the launcher dies; in
// the spare itself it never returns: it exits 0 when the launcher closes the socket.
void serve(int fd);

// The launcher's end. A spare that exits, or answers otherwise than the protocol says, is gone
// for good: every later request gets nullopt and `why()` says what happened.
class Client {
 public:
  explicit Client(int fd) : fd_(fd) {}
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Whether the spare said it is ready (non-blocking).
  bool ready();
  // A worker forked with `env`, its output on `out_fd` (the caller still closes its copy), told to
  // go on: its pid, or nullopt when the spare is not ready, is gone or refused (why()). Blocks for
  // the answer, a fork's time, at most `timeout_ms`.
  std::optional<pid_t> fork_worker(const std::map<std::string, std::string>& env, int out_fd,
                                   int timeout_ms);
  const std::string& why() const { return why_; }

 private:
  void gone(std::string why);
  // Sends the request with `fds` (the output pipe, the go-ahead's read end); the pid answered.
  std::optional<pid_t> ask(const std::map<std::string, std::string>& env,
                           const std::vector<int>& fds, int timeout_ms);

  int fd_;
  bool ready_ = false;
  std::string why_;
};

}  // namespace ddp::spare
