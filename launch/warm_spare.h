#pragma once
// --warm-spare: the launcher's side of Note [A replacement forked from a warm spare]
// (ddp/common/fork_server.h). One more copy of the program runs beside the workers with the
// spare's socket in its environment; once it has loaded, a restarted worker is forked from it
// instead of being started as a new process. Whatever keeps it from forking one (still loading,
// gone, refused), the worker starts as a new process, as without --warm-spare.

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/common/fork_server.h"

namespace ddp::launch {

class WarmSpare {
 public:
  // Starts `program` (`argv`: its arguments, the first its name) with `env` and the spare's
  // socket, its output on the launcher's stderr; makes the launcher a child subreaper, which the
  // workers it forks need (they are re-parented to it). Throws Error when it cannot start.
  WarmSpare(const std::string& program, const std::vector<std::string>& argv,
            const std::map<std::string, std::string>& env);
  // Closes the socket (a spare then exits), then kills and reaps it.
  ~WarmSpare();
  WarmSpare(const WarmSpare&) = delete;
  WarmSpare& operator=(const WarmSpare&) = delete;

  pid_t pid() const { return pid_; }
  // Whether it said it is ready (non-blocking).
  bool ready() { return client_->ready(); }
  // A worker with `env`, its output on `out_fd`, forked from the spare: its pid, the launcher's
  // child; nullopt when the spare is not ready yet, or gone (then `gone()` says why).
  std::optional<pid_t> fork_worker(const std::map<std::string, std::string>& env, int out_fd);
  // Why the spare can fork no more workers (it ended, refused, did not answer); "" while it can.
  std::string gone();

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::unique_ptr<spare::Client> client_;
};

}  // namespace ddp::launch
