#pragma once
// The launcher's decisions, as pure functions: its options (the command line over DDP_LAUNCH_*
// variables over torchrun's PET_* over a scheduler's RANK/WORLD_SIZE or NODE_RANK), each worker's
// environment (torchrun's contract), how a worker's end is described.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::launch {

struct LaunchOptions {
  int nproc = 1;  // processes on this node (auto, cpu, gpu are resolved by parse_launch_args)
  int nnodes = 1;
  // --nnodes MIN:MAX (torchrun's syntax): elastic. Node 0's launcher serves the job's store
  // itself; each launcher restarts a failed worker alone (counted against --max-restarts) and the
  // others go on without stopping (comm/elastic/elastic.h); the job goes on while MIN nodes are in
  // it.
  bool elastic = false;
  int min_nnodes = 1;
  double node_timeout = 15.0;  // elastic, several nodes: seconds without a node's heartbeat
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port when the job is on this host, else 29500
  int max_restarts = 0;
  // Elastic: restarted workers forked from a loaded copy of the program (ddp/common/fork_server.h).
  bool warm_spare = false;
  double monitor_interval = 0.1;  // seconds between checks of the workers
  double grace_period = 5.0;      // seconds between SIGTERM and SIGKILL
  double rdzv_timeout = 600.0;    // seconds node 0's name may take to resolve (torchrun's join)
  std::string log_dir;            // a rank<N>.log per worker
  bool tee = false;               // with log_dir: the console too
  std::vector<int> local_ranks_filter;  // the local ranks shown on the console; empty: all
  std::string run_id = "none";
  std::vector<std::string> devices;  // GPUs, one per local rank (CUDA_VISIBLE_DEVICES)
  std::vector<std::string> program;  // the program and its arguments
  bool help = false;
  // Where a scheduler runs one launcher a process (scheduler_env.h): the LOCAL_RANK,
  // LOCAL_WORLD_SIZE and NODE_RANK (the worker's GROUP_RANK) it gave, passed on to the worker;
  // -1: the launcher's own (local rank, --nproc, --node-rank).
  int given_local_rank = -1;
  int given_local_world_size = -1;
  int given_group_rank = -1;
  // What the options were read from besides the command line (variables, a scheduler's
  // contract), for the launcher's first line; torchrun's PET_ variables that name no launcher
  // option, left alone.
  std::vector<std::string> read_from;
  std::vector<std::string> ignored_env;
  // Not options: set by supervise() when the job starts.
  std::string job_token;   // the rendezvous store's secret (DDP_JOB_TOKEN); "": none
  std::string flight_dir;  // where workers leave a copy of their flight records (DDP_FLIGHT_DIR)
};

// What auto means for --nproc: the GPUs visible (`cuda_visible_devices` when set, else
// `gpus_present`), at least 1.
int auto_nproc(const char* cuda_visible_devices, int gpus_present);

// Parses `args` (argv without the program name): launcher options up to the first argument that is
// not one (or `--`), read by cxxopts, then the program and its arguments. An option may be spelt
// with '_' for '-' (--nproc_per_node, as torchrun takes it). A flag (--tee) alone means true and
// takes the next word as its value only when that is a bool word ("--tee false",
// ddp/common/bool_words.h); otherwise the next word is the next option or the program. Under the
// command line, from `env`: DDP_LAUNCH_<OPTION>, then torchrun's PET_<OPTION> (upper case, '_'
// for '-'; a PET_ variable naming no option here is left alone), then a scheduler's variables
// (scheduler_env.h). `gpus_present` and `host_cores` are for --nproc auto, gpu and cpu. Throws
// InputError naming the option or variable.
LaunchOptions parse_launch_args(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& env, int gpus_present,
                                int host_cores = 1);

// The --help text.
std::string launch_help();

// The variables a worker gets on top of the launcher's environment (torchrun's contract, plus
// DDP_JOB_TOKEN and DDP_FLIGHT_DIR when set in `options`).
// `inherited` is the launcher's environment (OMP_NUM_THREADS and USE_LIBUV=0 are set only when it
// has none).
std::map<std::string, std::string> worker_env(const LaunchOptions& options, int local_rank,
                                              int master_port, int restart_count,
                                              const std::map<std::string, std::string>& inherited);

// --warm-spare's environment: the launcher's (`inherited`), with a worker's threads and the job's
// WORLD_SIZE but no RANK (a worker forked from the spare gets its own environment whole): a
// program that does not know the spare's protocol fails at its rendezvous (torchrun's contract
// needs both) rather than join the job or train alone.
std::map<std::string, std::string> warm_spare_env(
    const LaunchOptions& options, int master_port,
    const std::map<std::string, std::string>& inherited);

// The job's token: DDP_JOB_TOKEN from `inherited` when set (every node of a multi-node job must
// share one), else `fresh` on one node, else "" (nodes cannot agree on a fresh one: the store is
// then open to any client, and the launcher says so).
std::string choose_job_token(int nnodes, const std::map<std::string, std::string>& inherited,
                             const std::string& fresh);

// Whether a process whose /proc/<pid>/status is `proc_status` catches signal `sig` (SigCgt):
// the launcher asks only such workers for flight records, as SIGUSR1 kills a program without
// a handler.
bool catches_signal(const std::string& proc_status, int sig);

// "exit code 3" or "signal SIGKILL (9)" for a waitpid status.
std::string describe_status(int wait_status);

// The exit code of a launcher whose first failed worker ended with `wait_status`: its exit code,
// or 128 + the signal.
int exit_code_of(int wait_status);

// The executable `program` names: itself when it has a '/', else the first match in `path`
// (a PATH value). nullopt when there is none that is executable.
std::optional<std::string> find_program(const std::string& program, const std::string& path);

}  // namespace ddp::launch
