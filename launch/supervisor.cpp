#include "supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <variant>

#include "arbiter_service.h"
#include "ddp/comm/diagnostics/diagnose.h"
#include "ddp/comm/elastic/elastic_keys.h"
#include "ddp/comm/store/store_connection.h"
#include "ddp/comm/store/store_server.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/socket.h"
#include "exec_args.h"
#include "node_link.h"
#include "warm_spare.h"

namespace ddp::launch {
namespace {

constexpr size_t kTailLines = 20;  // of a failed worker's output, in the summary
// Elastic, a node other than node 0: how long it waits for node 0, to register or to join again.
constexpr auto kRejoinWithin = std::chrono::minutes(5);

// Set by the signal handlers; the self-pipe wakes the poll() of the main loop.
volatile sig_atomic_t g_stop_signal = 0;
int g_wake_fd = -1;

void on_signal(int sig) {
  if (sig != SIGCHLD) g_stop_signal = sig;
  const char byte = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_wake_fd, &byte, 1);
}

void note(const std::string& text) {
  fmt::print(stderr, "[launcher] {}\n", text);
  std::fflush(stderr);
}

std::string system_reason() {
  return std::strerror(errno);
}

// A TCP port on this host that was free a moment ago (the kernel's choice).
int free_port() {
  const net::Resolved loopback = net::resolve_tcp("127.0.0.1", 0, AF_INET, AI_NUMERICHOST);
  const net::UniqueFd fd =
      loopback.addresses ? net::bind_tcp(*loopback.addresses) : net::UniqueFd();
  const int port = fd ? net::local_port(fd.get()) : 0;
  if (port == 0) throw Error("cannot find a free TCP port: " + system_reason());
  return port;
}

// Node 0 hosts the rendezvous (rank 0's store): its port must be free here, on every IPv4
// interface.
void check_port_free(int port) {
  const net::Resolved wildcard = net::resolve_tcp("", port, AF_INET, AI_PASSIVE);
  const net::UniqueFd fd =
      wildcard.addresses ? net::bind_tcp(*wildcard.addresses) : net::UniqueFd();
  if (!fd) {
    throw InputError(
        fmt::format("--master-port {}: cannot be used on this host ({}): another "
                    "job may hold it; pick another or leave it out on one host",
                    port, system_reason()));
  }
}

// How often a name that does not resolve yet is said again.
constexpr auto kResolveNoteEvery = std::chrono::seconds(5);

// 128 random bits as hex, from the kernel.
std::string random_token() {
  unsigned char bytes[16];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
    throw Error("cannot read /dev/urandom for the job token");
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

// A private directory (0700) for the workers' copies of their flight records.
std::string make_flight_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddp-launcher-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Error(fmt::format("cannot create a directory like {}: {}", pattern, system_reason()));
  }
  return pattern;
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // read end of its stdout and stderr
  bool running = false;
  int status = 0;
  std::string partial;  // output after the last newline
  std::deque<std::string> tail;
  std::unique_ptr<std::ofstream> log;
  WorkerId elastic_id;  // elastic: its id
  bool noted = false;   // elastic: its end has been dealt with
  std::chrono::steady_clock::time_point started;
  double wall_seconds = 0;  // from its start to its end, once reaped
  double cpu_seconds = 0;   // user and system, its threads' included, once reaped
  bool from_spare = false;  // forked from the warm spare (--warm-spare)
};

// Reaps `w` (waitpid's `options`): true when it has ended, its status, run time and CPU time
// recorded.
bool reap_worker(Worker& w, int options) {
  struct rusage usage {};
  if (::wait4(w.pid, &w.status, options, &usage) != w.pid) return false;
  w.running = false;
  const auto ran = std::chrono::steady_clock::now() - w.started;
  w.wall_seconds = std::chrono::duration<double>(ran).count();
  w.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                  static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  return true;
}

// "elastic: worker 1.0 (local rank 1, pid 4242) lost: signal SIGKILL (9), after 3.2 s, 2.95 CPU
// s", or "... finished after 40.1 s, 37.20 CPU s": what a worker had cost when it ended.
std::string end_note(const Worker& w) {
  const std::string how = exit_code_of(w.status) == 0
                              ? std::string("finished")
                              : "lost: " + describe_status(w.status) + ",";
  return fmt::format("elastic: worker {} (local rank {}, pid {}) {} after {:.1f} s, {:.2f} CPU s",
                     w.elastic_id, w.local_rank, w.pid, how, w.wall_seconds, w.cpu_seconds);
}

class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, std::string program,
             std::map<std::string, std::string> inherited)
      : o_(options), program_(std::move(program)), inherited_(std::move(inherited)) {
    o_.job_token = choose_job_token(o_.nnodes, inherited_, random_token());
    o_.flight_dir = make_flight_dir();
  }
  ~Supervisor() {
    std::error_code ec;
    std::filesystem::remove_all(o_.flight_dir, ec);
  }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  int run() {
    install_signal_handlers();
    if (!o_.log_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o_.log_dir, ec);
      if (ec) {
        throw InputError(
            fmt::format("--log-dir {}: cannot create it: {}", o_.log_dir, ec.message()));
      }
    }
    if (!o_.read_from.empty()) {
      note(fmt::format("read from the environment: {}", fmt::join(o_.read_from, ", ")));
    }
    if (!o_.ignored_env.empty()) {
      note(fmt::format("not launcher options, left alone: {}", fmt::join(o_.ignored_env, ", ")));
    }
    if (o_.node_rank > 0 && !wait_resolvable(o_.master_addr)) return 128 + stop_signal();
    if (o_.job_token.empty()) {
      note(
          "no DDP_JOB_TOKEN in the environment: on several nodes the rendezvous store then "
          "accepts any client; export the same secret DDP_JOB_TOKEN on every node");
    }
    if (o_.elastic) return run_elastic();
    for (int restart = 0;; ++restart) {
      start_group(restart);
      const Outcome outcome = watch();
      if (outcome.stop_signal != 0) return 128 + outcome.stop_signal;
      if (!outcome.failed) return 0;
      if (restart >= o_.max_restarts) return exit_code_of(outcome.failed_status);
      note(fmt::format("restarting the workers ({} of {} restarts)", restart + 1, o_.max_restarts));
    }
  }

 private:
  struct Outcome {
    int stop_signal = 0;  // the launcher was told to stop
    bool failed = false;
    int failed_status = 0;
  };

  static void install_signal_handlers() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe: " + system_reason());
    g_wake_fd = fds[1];
    wake_read_fd_ = fds[0];
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM, SIGCHLD}) ::sigaction(sig, &action, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
  }

  void start_group(int restart) {
    const bool one_host = o_.nnodes == 1;
    int port = o_.master_port;
    if (port == 0) port = one_host ? free_port() : 29500;
    if (o_.node_rank == 0 && (o_.master_port != 0 || !one_host)) check_port_free(port);
    port_ = port;
    note(fmt::format("node {} of {}: starting {} worker(s) of {} (world size {}, master {}:{}{})",
                     o_.node_rank, o_.nnodes, o_.nproc, program_, o_.nnodes * o_.nproc,
                     o_.master_addr, port,
                     restart > 0 ? fmt::format(", restart {}", restart) : ""));

    workers_.clear();
    std::error_code ec;  // records of an earlier group are not this one's
    for (const auto& entry : std::filesystem::directory_iterator(o_.flight_dir, ec)) {
      std::filesystem::remove(entry.path(), ec);
    }
    for (int local = 0; local < o_.nproc; ++local) {
      auto env = inherited_;
      for (auto& [k, v] : worker_env(o_, local, port, restart, inherited_)) env[k] = v;
      workers_.push_back(spawn(local, env));
      note(fmt::format("rank {}: pid {}", workers_.back().rank, workers_.back().pid));
    }
  }

  // A worker process with `env`: forked from the warm spare where `from_spare` and it can (Note
  // [A replacement forked from a warm spare]), else started anew.
  Worker spawn(int local_rank, const std::map<std::string, std::string>& env,
               bool from_spare = false) {
    Worker w;
    w.local_rank = local_rank;
    w.rank = o_.node_rank * o_.nproc + local_rank;
    if (!o_.log_dir.empty()) {
      const std::string path = fmt::format("{}/rank{}.log", o_.log_dir, w.rank);
      w.log = std::make_unique<std::ofstream>(path, std::ios::app);
      if (!*w.log) throw InputError(fmt::format("--log-dir: cannot write {}", path));
    }
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw Error("pipe: " + system_reason());
    const std::optional<pid_t> forked =
        from_spare ? fork_from_spare(env, out[1]) : std::optional<pid_t>();
    const pid_t pid = forked ? *forked : start_process(env, out[1]);
    ::setpgid(pid, pid);  // also here: no signal can race the child's own setpgid
    ::close(out[1]);
    w.pid = pid;
    w.started = std::chrono::steady_clock::now();
    w.out_fd = out[0];
    w.running = true;
    w.from_spare = forked.has_value();
    return w;
  }

  // The program started with `env`, its stdout and stderr on `out_fd`: its pid.
  pid_t start_process(const std::map<std::string, std::string>& env, int out_fd) {
    const ExecArgs exec(o_.program, env);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("fork: " + system_reason());
    if (pid == 0) {
      ::setpgid(0, 0);  // its own group: the launcher signals it and its children together
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // dies with the launcher, even by SIGKILL
      if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(out_fd, STDERR_FILENO);
      std::signal(SIGPIPE, SIG_DFL);
      ::execve(program_.c_str(), exec.argv(), exec.envp());
      const char msg[] = "launcher: exec failed\n";
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
      ::_exit(127);
    }
    return pid;
  }

  // --warm-spare: started once, with the first workers.
  void start_warm_spare() {
    if (!o_.warm_spare || spare_) return;
    spare_ = std::make_unique<WarmSpare>(program_, o_.program,
                                         warm_spare_env(o_, worker_port_, inherited_));
    spare_started_ = Clock::now();
    note(fmt::format("elastic: warm spare started: pid {}", spare_->pid()));
  }

  // From the elastic loops, every pump: says once when the warm spare has loaded, and when it is
  // gone (then dropped).
  void watch_spare() {
    if (!spare_) return;
    if (const std::string gone = spare_->gone(); !gone.empty()) return drop_spare(gone);
    if (spare_ready_said_ || !spare_->ready()) return;
    spare_ready_said_ = true;
    note(
        fmt::format("elastic: the warm spare is ready after {:.1f} s: restarted workers are "
                    "forked from it",
                    std::chrono::duration<double>(Clock::now() - spare_started_).count()));
  }

  void drop_spare(const std::string& why) {
    note("elastic: the warm spare forks no more workers (" + why +
         "): restarted workers start anew");
    spare_.reset();
  }

  // A worker forked from the warm spare, or nullopt (said when the spare is loading or gone).
  std::optional<pid_t> fork_from_spare(const std::map<std::string, std::string>& env, int out_fd) {
    if (!spare_) return std::nullopt;
    const std::optional<pid_t> pid = spare_->fork_worker(env, out_fd);
    if (pid) return pid;
    const std::string gone = spare_->gone();
    if (gone.empty()) {
      note("elastic: the warm spare is still loading: this worker starts anew");
    } else {
      drop_spare(gone);
    }
    return std::nullopt;
  }

  // Elastic (Note [Elastic membership] and Note [Elastic nodes] in
  // ddp/comm/elastic/elastic_keys.h): node 0's launcher serves the store and its arbiter decides
  // the generations; a failed worker is restarted alone and the others go on, or, when nothing
  // holds the group's state any more or the program does not take part, every worker starts again
  // (Note [Committed state has an owner] in arbiter.h).
  int run_elastic() {
    if (o_.node_rank > 0) return run_elastic_node();
    port_ = o_.master_port != 0 ? o_.master_port : o_.nnodes == 1 ? free_port() : 29500;
    // On one node the store listens where its workers look for it; on several, on every
    // interface (the others reach it at --master-addr, which names this host).
    const std::string listen = o_.nnodes == 1 ? o_.master_addr : "";
    comm::StoreServer server(listen, port_, o_.job_token);
    comm::StoreConnection store(o_.nnodes == 1 ? o_.master_addr : "127.0.0.1", port_, o_.job_token,
                                std::chrono::seconds(30));
    note(fmt::format(
        "elastic: node 0 of {}:{}: starting {} worker(s) of {} (store {}:{}, up to {} "
        "restart(s))",
        o_.min_nnodes, o_.nnodes, o_.nproc, program_, o_.master_addr, port_, o_.max_restarts));
    ArbiterService service(store, {o_.min_nnodes, o_.nnodes, node_timeout(), o_.max_restarts},
                           note);
    workers_.clear();
    const std::vector<WorkerId> first = start_round(false, 0);
    if (const auto code = carry_out(service.start_round(first, worker_port_), service)) {
      return *code;
    }
    while (true) {
      pump(20);
      if (const int sig = stop_signal(); sig != 0) {
        service.announce_end("failed: node 0's launcher was stopped", std::chrono::seconds(2));
        return 128 + sig;
      }
      watch_spare();
      reap();
      std::vector<ArbiterAction> actions = report_ends(service);
      for (auto& a : service.poll()) actions.push_back(std::move(a));
      if (const auto code = carry_out(actions, service)) return *code;
    }
  }

  // Node 0's workers that ended since the last call, told to the arbiter (the failed ones in one
  // event: workers killed together are one decision). Returns what the arbiter decided.
  std::vector<ArbiterAction> report_ends(ArbiterService& service) {
    std::vector<WorkerId> done, lost;
    std::string what;
    int code = 0;
    for (Worker* w : newly_ended()) {
      if (exit_code_of(w->status) == 0) {
        note(end_note(*w));
        done.push_back(w->elastic_id);
        continue;
      }
      if (lost.empty()) code = exit_code_of(w->status);
      failed_status_ = w->status;
      lost.push_back(w->elastic_id);
      what += (what.empty() ? "" : "; ") + loss_of(*w);
      note(end_note(*w));
    }
    std::vector<ArbiterAction> actions;
    if (!done.empty()) actions = service.done(done);
    if (lost.empty()) return actions;
    const int64_t generation = service.arbiter().generation();
    for (auto& a : service.lost(lost, what, code)) actions.push_back(std::move(a));
    const Arbiter& arbiter = service.arbiter();
    if (arbiter.phase() == Arbiter::Phase::kRunning && arbiter.generation() != generation) {
      note("elastic: " + arbiter.describe_generation());
    }
    return actions;
  }

  // The arbiter's decisions on processes (the service carried out the others); returns the
  // launcher's exit code when the job ended.
  std::optional<int> carry_out(std::vector<ArbiterAction> actions, ArbiterService& service) {
    for (size_t i = 0; i < actions.size(); ++i) {
      if (const auto* restart = std::get_if<action::RestartWorker>(&actions[i])) {
        ++restarts_;  // within the arbiter's count of node 0's
        restart_worker(restart->worker.local_rank, restart->worker.incarnation);
      } else if (const auto* group = std::get_if<action::RestartGroup>(&actions[i])) {
        ++restarts_;
        stop_for_new_round();
        const std::vector<WorkerId> ids = start_round(false, group->round);
        for (auto& more : service.start_round(ids, worker_port_)) actions.push_back(more);
      } else if (const auto* end = std::get_if<action::End>(&actions[i])) {
        return end_elastic(*end, service);
      }
    }
    return std::nullopt;
  }

  int end_elastic(const action::End& end, ArbiterService& service) {
    if (end.exit_code == 0) {
      note("elastic: " + end.why + ": " + members_with_pids(end.finished));
      if (any_running()) {  // the training is over: joiners are too late
        note("elastic: the group finished; stopping the worker(s) still waiting to join");
        stop_group(SIGTERM);
      }
      drain(Clock::now() + std::chrono::seconds(1));
      service.announce_end("done", node_timeout());
      return 0;
    }
    note(fmt::format("elastic: {}: {}", end.why, any_running() ? "stopping" : "the job failed"));
    stop_group(SIGTERM);
    service.announce_end("failed: " + end.why, node_timeout());
    return end.exit_code;
  }

  // "worker 0.0 (pid 4242), worker 1.1 (pid 4250)": who finished, for the tests that compare
  // survivors' processes.
  std::string members_with_pids(const std::vector<WorkerId>& ids) const {
    std::vector<std::string> out;
    for (const auto& id : ids) {
      const auto it = std::find_if(workers_.begin(), workers_.end(),
                                   [&](const Worker& w) { return w.elastic_id == id; });
      if (it != workers_.end()) out.push_back(fmt::format("worker {} (pid {})", id, it->pid));
    }
    return fmt::format("{}", fmt::join(out, ", "));
  }

  // Every worker of a round fresh (not joining), each local rank's next incarnation, with a new
  // rendezvous port on node 0 (`worker_port`: another node's, as node 0 chose). Returns their ids.
  std::vector<WorkerId> start_round(bool join, int round, int worker_port = 0) {
    worker_port_ = worker_port != 0 ? worker_port : free_port();
    std::vector<WorkerId> ids;
    for (int local = 0; local < o_.nproc; ++local) {
      workers_.push_back(spawn_elastic(local, next_incarnation_of(local), join));
      ids.push_back(workers_.back().elastic_id);
    }
    if (round > 0) {
      note(fmt::format("elastic: round {}: every worker of this node started again ({})", round,
                       to_string(ids)));
    }
    if (round == 0) start_warm_spare();  // beside the first workers
    return ids;
  }

  // Before every worker starts again: the running ones are stopped (no news: the arbiter decided
  // it).
  void stop_for_new_round() {
    if (any_running()) stop_group(SIGTERM);
    newly_ended();
  }

  int next_incarnation_of(int local) const {
    int incarnation = 0;
    for (const Worker& w : workers_) {
      if (w.local_rank == local) {
        incarnation = std::max(incarnation, w.elastic_id.incarnation + 1);
      }
    }
    return incarnation;
  }

  // A node other than node 0: registers its workers with node 0's arbiter, starts them, reports
  // their ends and restarts (Note [Elastic nodes]); starts them all again when node 0 says so.
  // While node 0 cannot be reached for the node timeout, the arbiter has dropped this node: its
  // workers are stopped, and started again to join the group once node 0 can be reached.
  int run_elastic_node() {
    port_ = o_.master_port != 0 ? o_.master_port : 29500;  // its name resolved in run()
    NodeLink link(o_.master_addr, port_, o_.job_token, o_.node_rank, node_timeout(), note);
    note(fmt::format("elastic: node {} of {}:{}: registering {} worker(s) with node 0 at {}:{}",
                     o_.node_rank, o_.min_nnodes, o_.nnodes, o_.nproc, o_.master_addr, port_));
    workers_.clear();
    if (!join_round(link, 0)) return 128 + stop_signal();
    while (true) {
      pump(std::max(1, static_cast<int>(o_.monitor_interval * 1000)));
      if (const int sig = stop_signal(); sig != 0) return 128 + sig;
      watch_spare();
      reap();
      for (Worker* w : newly_ended()) {
        if (exit_code_of(w->status) == 0) {
          note(end_note(*w));
          link.report({comm::NodeEvent::Kind::kDone, o_.node_rank, w->elastic_id.to_string(), ""});
          continue;
        }
        failed_status_ = w->status;
        link.report(
            {comm::NodeEvent::Kind::kLost, o_.node_rank, w->elastic_id.to_string(), loss_of(*w)});
        note(end_note(*w));
        if (link.cut_off()) {
          to_restart_.push_back(w->local_rank);
        } else if (const auto id = restart(*w)) {
          link.report({comm::NodeEvent::Kind::kJoin, o_.node_rank, id->to_string(), ""});
        }
      }
      const NodeLink::News news = link.tick();
      if (news.ended) {
        if (any_running()) stop_group(SIGTERM);
        note(fmt::format("elastic: node 0 says the job ended: {}", *news.ended));
        return *news.ended == "done" ? 0 : std::max(1, exit_code_of(failed_status_));
      }
      if (news.round) {
        stop_for_new_round();
        to_restart_.clear();
        if (!join_round(link, *news.round)) return 128 + stop_signal();
      }
      if (const auto code = follow_the_link(link)) return *code;
      // Workers that all finished wait for node 0's word that the job did (tick() above); one
      // that failed, with no restart left, ends this node's part.
      if (!any_running() && to_restart_.empty() && link.all_sent() &&
          (!all_finished() || link.cut_off())) {
        note(all_finished() ? "elastic: this node's workers finished, and node 0 cannot be reached"
                            : "elastic: no worker of this node is left, and no restart");
        return std::max(1, exit_code_of(failed_status_));
      }
    }
  }

  // Registers this node's next workers for round `round` and starts them as node 0 admits them;
  // false when the launcher was told to stop meanwhile.
  bool join_round(NodeLink& link, int round) {
    std::vector<WorkerId> ids;
    for (int local = 0; local < o_.nproc; ++local) {
      ids.push_back(elastic_id(local, next_incarnation_of(local)));
    }
    const auto admitted =
        link.register_node(ids, round, kRejoinWithin, [] { return g_stop_signal != 0; });
    if (!admitted) return false;
    start_round(admitted->join, round, admitted->worker_port);
    return true;
  }

  // A node cut off from node 0 for the node timeout is out of the group: its workers are stopped,
  // and started again to join once node 0 can be reached. Returns this node's exit code when it
  // cannot join again.
  std::optional<int> follow_the_link(NodeLink& link) {
    if (link.cut_off() && any_running()) {
      note(
          fmt::format("elastic: node {} is out of the group: stopping its worker(s), which join "
                      "again when node 0 can be reached",
                      o_.node_rank));
      for (const Worker& w : workers_) {
        if (w.running) to_restart_.push_back(w.local_rank);
      }
      stop_group(SIGKILL);
      newly_ended();  // marks them dealt with: out by this node's own doing, no news
      if (restarts_ + static_cast<int>(to_restart_.size()) > o_.max_restarts) {
        note("elastic: too few restarts left to join again: this node's part of the job ended");
        return 1;
      }
    }
    // A pulled link gives no answer; a host that answers but refuses the store's port has lost
    // node 0's launcher, and the job with it: no use waiting for it to come back.
    if (link.cut_off() &&
        net::refuses_connections(o_.master_addr, port_, std::chrono::milliseconds(100))) {
      note(fmt::format(
          "elastic: node 0's launcher is gone ({}:{} refuses connections): this node's part of "
          "the job ended",
          o_.master_addr, port_));
      return 1;
    }
    if (link.cut_off() && link.silent() > kRejoinWithin) {
      note(fmt::format("elastic: node 0 not reached for {} s: this node's part of the job ended",
                       std::chrono::duration_cast<std::chrono::seconds>(link.silent()).count()));
      return 1;
    }
    if (!link.cut_off()) {
      for (int local : to_restart_) {
        if (const auto id = restart_local(local)) {
          link.report({comm::NodeEvent::Kind::kJoin, o_.node_rank, id->to_string(), ""});
        }
      }
      to_restart_.clear();
    }
    return std::nullopt;
  }

  Clock::duration node_timeout() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(o_.node_timeout));
  }

  // Node 0's name, as a pod's DNS name, resolves only once that pod is ready (a Service publishes
  // ready pods): looked up again until --rdzv-timeout, said every few seconds. False: a signal
  // stopped the wait.
  bool wait_resolvable(const std::string& host) {
    const auto start = Clock::now();
    const auto limit = std::chrono::duration<double>(o_.rdzv_timeout);
    auto next_note = start;
    for (;;) {
      const net::Resolved found = net::resolve_tcp(host, 0);
      const auto now = Clock::now();
      const double waited = std::chrono::duration<double>(now - start).count();
      if (found.addresses) {
        if (next_note != start) {
          note(fmt::format("--master-addr {} resolved after {:.1f} s", host, waited));
        }
        return true;
      }
      if (now - start >= limit) {
        throw InputError(
            fmt::format("--master-addr {}: not resolved within {:g} s (--rdzv-timeout): {}", host,
                        o_.rdzv_timeout, found.error));
      }
      if (now >= next_note) {
        note(fmt::format("--master-addr {} does not resolve yet ({}): trying again for up to "
                         "{:g} s",
                         host, found.error, o_.rdzv_timeout));
        next_note = now + kResolveNoteEvery;
      }
      if (g_stop_signal != 0) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  // The signal that told the launcher to stop (0: none); its workers are stopped by then.
  int stop_signal() {
    const int sig = g_stop_signal;
    if (sig != 0) {
      note(fmt::format("got SIG{}: stopping the workers", sigabbrev_np(sig)));
      stop_group(sig);
    }
    return sig;
  }

  // Whether the newest worker of every local rank ended with exit 0.
  bool all_finished() const {
    std::map<int, const Worker*> newest;
    for (const Worker& w : workers_) newest[w.local_rank] = &w;
    return std::all_of(newest.begin(), newest.end(), [](const auto& local_worker) {
      return !local_worker.second->running && exit_code_of(local_worker.second->status) == 0;
    });
  }

  bool any_running() const {
    return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
  }

  // The workers that ended since the last call (pointers into workers_, valid until it grows).
  std::vector<Worker*> newly_ended() {
    std::vector<Worker*> ended;
    for (Worker& w : workers_) {
      if (w.running || w.noted) continue;
      w.noted = true;
      ended.push_back(&w);
    }
    return ended;
  }

  // A lost worker as the arbiter's notice names it.
  std::string loss_of(const Worker& w) const {
    return fmt::format("worker {} (local rank {}, pid {}, host {}): {}", w.elastic_id, w.local_rank,
                       w.pid, net::host_name(), describe_status(w.status));
  }

  // `w` again, to join the group, while restarts are left: the new worker's id (w is invalid from
  // here, as workers_ grows).
  std::optional<WorkerId> restart(const Worker& w) {
    return restart_local(w.local_rank, w.elastic_id.incarnation + 1);
  }

  // A node other than node 0: `local` again, to join the group, while its restarts last.
  std::optional<WorkerId> restart_local(int local, int incarnation = -1) {
    if (restarts_ >= o_.max_restarts) return std::nullopt;
    ++restarts_;
    return restart_worker(local, incarnation < 0 ? next_incarnation_of(local) : incarnation);
  }

  // Starts worker `<local>.<incarnation>` to join the running group (the restart is counted by
  // the caller); returns its id.
  WorkerId restart_worker(int local, int incarnation) {
    workers_.push_back(spawn_elastic(local, incarnation, true));
    const Worker& joiner = workers_.back();
    note(fmt::format("elastic: restart {} of {}: worker {} (pid {}) joins when ready", restarts_,
                     o_.max_restarts, joiner.elastic_id, joiner.pid));
    return joiner.elastic_id;
  }

  // This node's worker of local rank `local`, incarnation `incarnation`.
  WorkerId elastic_id(int local, int incarnation) const {
    return {o_.node_rank, local, incarnation, o_.nnodes > 1};
  }

  // The workers' environment under elastic: MASTER_PORT is their own rendezvous (a program that
  // is not ddp_train --elastic forms its group there, as under torchrun), DDP_ELASTIC_STORE the
  // arbiter's store.
  Worker spawn_elastic(int local_rank, int incarnation, bool join) {
    auto env = inherited_;
    for (auto& [k, v] : worker_env(o_, local_rank, worker_port_, incarnation, inherited_)) {
      env[k] = v;
    }
    const WorkerId id = elastic_id(local_rank, incarnation);
    env["DDP_ELASTIC_ID"] = id.to_string();
    env["DDP_ELASTIC_STORE"] = fmt::format("{}:{}", o_.master_addr, port_);
    if (join) env["DDP_ELASTIC_JOIN"] = "1";
    Worker w = spawn(local_rank, env, join);
    w.elastic_id = id;
    note(fmt::format("elastic: worker {} (local rank {}) started: pid {}{}", id, local_rank, w.pid,
                     w.from_spare ? ", forked from the warm spare" : ""));
    return w;
  }

  // Until all workers succeeded, one failed, or a stop signal came.
  Outcome watch() {
    const int interval_ms = std::max(1, static_cast<int>(o_.monitor_interval * 1000));
    while (true) {
      pump(interval_ms);
      if (g_stop_signal != 0) {
        const int sig = g_stop_signal;
        note(fmt::format("got SIG{}: stopping the workers", sigabbrev_np(sig)));
        stop_group(sig);
        return {sig, false, 0};
      }
      reap();
      if (const Worker* w = first_failed()) {
        const Outcome outcome{0, true, w->status};
        const int rank = w->rank;
        ask_for_flight_records();
        reap();
        // How the ended workers ended, read before the SIGTERMs below, which are no news.
        const comm::RankEnds ended = ends_so_far();
        stop_group(SIGTERM);  // workers_ stays: the summary below reads it
        summarize(rank);
        report_unreachable_master();
        report_flight_records(ended);
        return outcome;
      }
      if (std::none_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.running; })) {
        drain(Clock::now() + std::chrono::seconds(1));
        return {};
      }
    }
  }

  // The failed worker to blame, among those that ended since the last check: one killed by a
  // signal before one that exited with an error, since the others' errors usually follow a
  // peer's death (a broken connection); then the lowest rank.
  const Worker* first_failed() const {
    const Worker* found = nullptr;
    for (const Worker& w : workers_) {
      if (w.running || exit_code_of(w.status) == 0) continue;
      if (found == nullptr || (WIFSIGNALED(w.status) && !WIFSIGNALED(found->status))) found = &w;
    }
    return found;
  }

  // Polls the output pipes (and the wake-up pipe) for up to `timeout_ms`, relaying what came.
  void pump(int timeout_ms) {
    std::vector<pollfd> fds = {{wake_read_fd_, POLLIN, 0}};
    std::vector<Worker*> owners = {nullptr};
    for (Worker& w : workers_) {
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        owners.push_back(&w);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    char buffer[65536];
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (owners[i] == nullptr) continue;  // drained the wake-up bytes
      Worker& w = *owners[i];
      if (n > 0) {
        w.partial.append(buffer, static_cast<size_t>(n));
        for (size_t nl; (nl = w.partial.find('\n')) != std::string::npos;) {
          emit(w, w.partial.substr(0, nl));
          w.partial.erase(0, nl + 1);
        }
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        if (!w.partial.empty()) emit(w, w.partial);
        w.partial.clear();
        ::close(w.out_fd);
        w.out_fd = -1;
      }
    }
  }

  void emit(Worker& w, const std::string& line) {
    w.tail.push_back(line);
    if (w.tail.size() > kTailLines) w.tail.pop_front();
    if (w.log) *w.log << line << '\n' << std::flush;
    const bool console = o_.log_dir.empty() || o_.tee;
    const auto& filter = o_.local_ranks_filter;
    if (console &&
        (filter.empty() || std::find(filter.begin(), filter.end(), w.local_rank) != filter.end())) {
      fmt::print(stdout, "[rank {}] {}\n", w.rank, line);
      std::fflush(stdout);
    }
  }

  void reap() {
    for (Worker& w : workers_) {
      if (w.running) reap_worker(w, WNOHANG);
    }
  }

  // `sig` to every running worker's group; SIGKILL to those still running after the grace
  // period. Returns when all have ended and their output is read.
  void stop_group(int sig) {
    for (Worker& w : workers_) {
      if (w.running) ::kill(-w.pid, sig);
    }
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_period * 1000));
    while (Clock::now() < deadline && std::any_of(workers_.begin(), workers_.end(),
                                                  [](const Worker& w) { return w.running; })) {
      pump(20);
      reap();
    }
    for (Worker& w : workers_) {
      if (!w.running) continue;
      note(fmt::format("rank {} did not stop within {} s: SIGKILL", w.rank, o_.grace_period));
      ::kill(-w.pid, SIGKILL);
      reap_worker(w, 0);
    }
    drain(Clock::now() + std::chrono::seconds(1));
  }

  // Reads what is left in the pipes (until they close, or `deadline` when a grandchild keeps
  // one open).
  void drain(Clock::time_point deadline) {
    while (Clock::now() < deadline && std::any_of(workers_.begin(), workers_.end(),
                                                  [](const Worker& w) { return w.out_fd >= 0; })) {
      pump(20);
    }
    for (Worker& w : workers_) {
      if (w.out_fd >= 0) ::close(w.out_fd);
      w.out_fd = -1;
    }
  }

  std::string flight_record_of(int rank) const {
    return fmt::format("{}/rank{}.json", o_.flight_dir, rank);
  }

  // After a failure, before stopping the others: the running workers that catch SIGUSR1 (ddp_train
  // does; a Python worker would die of it) get it and write their flight records, which show
  // where each one was. Waits until each has written one since (or has ended: then the record it
  // left, if any, is its last word), or 3 s. A record is not removed before: a worker that ends
  // of the same failure meanwhile writes its own, which must stay.
  void ask_for_flight_records() {
    std::vector<const Worker*> asked;
    const auto asked_at = std::filesystem::file_time_type::clock::now();
    for (const Worker& w : workers_) {
      if (!w.running) continue;
      std::string status;
      try {
        status = read_file(fmt::format("/proc/{}/status", w.pid));
      } catch (const std::exception&) {
        continue;  // it just ended
      }
      if (!catches_signal(status, SIGUSR1)) continue;
      ::kill(w.pid, SIGUSR1);
      asked.push_back(&w);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    auto answered = [&] {
      return std::all_of(asked.begin(), asked.end(), [&](const Worker* w) {
        std::error_code ec;
        const auto written = std::filesystem::last_write_time(flight_record_of(w->rank), ec);
        return !w->running || (!ec && written >= asked_at);
      });
    };
    while (!asked.empty() && !answered() && Clock::now() < deadline) {
      pump(50);
      reap();
    }
  }

  // How the workers that have ended so far ended (rank -> "signal SIGKILL (9)"): the hang doctor
  // names it beside a rank that left no flight record.
  comm::RankEnds ends_so_far() const {
    comm::RankEnds ended;
    for (const Worker& w : workers_) {
      if (!w.running) ended[w.rank] = describe_status(w.status);
    }
    return ended;
  }

  // The hang doctor's report over the records the workers left, if any
  // (comm/diagnostics/diagnose.h), with `ended` for the ranks that left none.
  void report_flight_records(const comm::RankEnds& ended) const {
    bool any = false;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(o_.flight_dir, ec)) {
      any = any || entry.path().extension() == ".json";
    }
    if (!any) return;
    try {
      const std::string report = comm::diagnose(comm::read_flight_dumps(o_.flight_dir), ended);
      note("the workers' flight records (ddp_train --diagnose):");
      size_t begin = 0;
      while (begin < report.size()) {
        const size_t end = report.find('\n', begin);
        note("  " + report.substr(begin, end - begin));
        if (end == std::string::npos) break;
        begin = end + 1;
      }
    } catch (const std::exception& e) {
      note(fmt::format("could not merge the workers' flight records: {}", e.what()));
    }
  }

  // On a node other than the first, a failure is often the network's: the line that says node 0
  // cannot be reached from here turns "timed out" into "this link is down".
  void report_unreachable_master() const {
    if (o_.node_rank == 0) return;
    const std::string reason =
        net::unreachable_reason(o_.master_addr, port_, std::chrono::seconds(3));
    if (!reason.empty()) {
      note(fmt::format("node 0 (--master-addr {}:{}) cannot be reached from node {}: {}",
                       o_.master_addr, port_, o_.node_rank, reason));
    }
  }

  void summarize(int failed_rank) {
    const Worker& w = *std::find_if(workers_.begin(), workers_.end(),
                                    [&](const Worker& x) { return x.rank == failed_rank; });
    note(
        fmt::format("rank {} (local rank {}, pid {}) failed first: {}; the other workers were "
                    "stopped",
                    w.rank, w.local_rank, w.pid, describe_status(w.status)));
    if (w.tail.empty()) {
      note(fmt::format("rank {} printed nothing", w.rank));
      return;
    }
    note(fmt::format("last {} line(s) of rank {}:", w.tail.size(), w.rank));
    for (const auto& line : w.tail) note("  " + line);
  }

  LaunchOptions o_;
  std::string program_;
  std::map<std::string, std::string> inherited_;  // the launcher's environment
  std::vector<Worker> workers_;
  int port_ = 0;         // the rendezvous port of the current group (elastic: the arbiter's store)
  int worker_port_ = 0;  // elastic: the workers' MASTER_PORT, of the current round
  // Elastic: the restarts so far, the status of the last worker that failed, and the local ranks
  // to start again once this node can reach node 0 (a node other than node 0).
  int restarts_ = 0;
  int failed_status_ = 0;
  std::vector<int> to_restart_;
  std::unique_ptr<WarmSpare> spare_;  // --warm-spare, while it can fork workers
  Clock::time_point spare_started_;
  bool spare_ready_said_ = false;
  static inline int wake_read_fd_ = -1;
};

}  // namespace

int supervise(const LaunchOptions& options, const std::string& program,
              const std::map<std::string, std::string>& env) {
  return Supervisor(options, program, env).run();
}

}  // namespace ddp::launch
