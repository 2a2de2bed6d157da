#include "train_main.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <malloc.h>
#include <signal.h>

#include <cxxopts.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/diagnostics/diagnose.h"
#include "ddp/comm/diagnostics/stacks.h"
#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/common/error.h"
#include "ddp/common/files.h"
#include "ddp/common/fork_server.h"
#include "ddp/common/log.h"
#include "ddp/data/time_series.h"
#include "ddp/train/config.h"
#include "ddp/train/trainer.h"
#include "ddp/version.h"

namespace ddp::apps {
namespace {

cxxopts::Options make_options() {
  cxxopts::Options options("ddp_train", "Distributed data-parallel training for LibTorch");
  options.set_width(100);
  options.add_options("General")(
      "config", "YAML config file; command-line options override its keys",
      cxxopts::value<std::string>(), "PATH")("h,help", "print this help and exit")(
      "version", "print the version, the LibTorch version and the compiled backends")(
      "list-devices", "print the visible CUDA devices (index, name, memory) and exit")(
      "make-timeseries-csv",
      "write the synthetic 10,000 x 12 time series (the csv dataset's default) to PATH and exit",
      cxxopts::value<std::string>(), "PATH")(
      "diagnose",
      "merge the ranks' flight records in DIR/debug (written on a failed collective or SIGUSR1) "
      "into a report naming the lagging rank and collective, and exit",
      cxxopts::value<std::string>(), "DIR");
  // One option per config key, generated from the same table the YAML loader uses.
  const ddp::train::Config defaults;
  auto adder = options.add_options("Training");
  for (const auto& key : ddp::train::config_keys()) {
    auto value = cxxopts::value<std::string>()->default_value(key.get(defaults));
    if (key.is_flag) value->implicit_value("true");
    adder(key.name, key.help, value, key.value_hint);
  }
  return options;
}

std::string version_text() {
  return fmt::format("ddp_train {}\nLibTorch {} ({})\nbackends: {}\nstack traces: {}\n",
                     DDP_VERSION, TORCH_VERSION,
                     torch::cuda::is_available() ? "CUDA available" : "CPU", DDP_BACKENDS,
                     ddp::stacks::supported() ? "libunwind, libdw"
                                              : "off (built without libunwind-dev and libdw-dev)");
}

// The tutorial's "print GPU status" step.
std::string devices_text() {
  const auto devices = ddp::comm::list_cuda_devices();
  if (devices.empty()) {
    return torch::cuda::is_available()
               ? fmt::format("{} CUDA device(s) visible, but this build cannot name them\n",
                             torch::cuda::device_count())
               : "no CUDA devices: this is a CPU-only machine or a LibTorch without CUDA; "
                 "training runs on the CPU (one process per CPU slot)\n";
  }
  std::string out;
  for (const auto& d : devices) {
    out += fmt::format("cuda:{}  {}  {:.1f} GiB\n", d.index, d.name,
                       static_cast<double>(d.total_memory) / (1024.0 * 1024.0 * 1024.0));
  }
  return out;
}

// The rank for log lines before the process group exists: from the launcher's variables, as is.
int rank_hint(const ddp::comm::Env& env) {
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    auto it = env.find(name);
    if (it != env.end()) return std::atoi(it->second.c_str());
  }
  return 0;
}

// A word cxxopts left over. ddp_train has no positional arguments, so a word right after a bool
// option ("--augment maybe") can only be meant as its value: it gets the same error as
// "--augment=maybe". Anything else is a stray word.
[[noreturn]] void reject_unmatched(const std::vector<std::string>& args, const std::string& word) {
  for (size_t i = 1; i < args.size(); ++i) {
    const auto* key = args[i - 1].rfind("--", 0) == 0
                          ? ddp::train::find_config_key(args[i - 1].substr(2))
                          : nullptr;
    if (args[i] == word && key != nullptr && key->is_flag) {
      ddp::train::Config scratch;
      ddp::train::set_config_value(scratch, key->name, word, "command line");  // throws
    }
  }
  throw ddp::InputError(fmt::format("command line: unexpected argument '{}' (see --help)", word));
}

// Parses the command line into a Config: defaults, then the file, then the command line.
// Returns false when the program should exit 0 (--help, --version, --make-timeseries-csv,
// --diagnose).
bool parse_command_line(int argc, char** argv, ddp::train::Config& config) {
  auto options = make_options();
  // cxxopts reads a bool option only as "--flag" or "--flag=value"; "--flag value" is joined first.
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> words = ddp::train::join_bool_values(args);
  words.insert(words.begin(), argv[0]);
  std::vector<const char*> word_ptrs;
  for (const auto& word : words) word_ptrs.push_back(word.c_str());
  cxxopts::ParseResult result;
  try {
    result = options.parse(static_cast<int>(word_ptrs.size()), word_ptrs.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw ddp::InputError(fmt::format("command line: {} (see --help)", e.what()));
  }
  if (result.count("help") != 0U) {
    std::cout << options.help({"General", "Training"});
    return false;
  }
  if (result.count("version") != 0U) {
    std::cout << version_text();
    return false;
  }
  if (result.count("list-devices") != 0U) {
    std::cout << devices_text();
    return false;
  }
  if (result.count("make-timeseries-csv") != 0U) {
    const auto path = result["make-timeseries-csv"].as<std::string>();
    ddp::write_file_atomically(path, ddp::data::synthetic_time_series_csv());
    std::cout << "wrote " << path << "\n";
    return false;
  }
  if (result.count("diagnose") != 0U) {
    std::cout << ddp::comm::diagnose(
        ddp::comm::read_flight_dumps(result["diagnose"].as<std::string>()));
    return false;
  }
  if (!result.unmatched().empty()) reject_unmatched(args, result.unmatched()[0]);
  if (result.count("config") != 0U) {
    ddp::train::apply_config_file(config, result["config"].as<std::string>());
  }
  for (const auto& key : ddp::train::config_keys()) {
    if (result.count(key.name) != 0U) {
      ddp::train::set_config_value(config, key.name, result[key.name].as<std::string>(),
                                   "command line");
    }
  }
  return true;
}

// SIGUSR1 asks every rank for its flight record (<output>/debug/rank<r>.json), like py-spy for a
// hung job: the handler only sets a flag that the watchdog thread (ddp/comm/diagnostics/watchdog.h)
// acts on.
void on_sigusr1(int /*signal*/) {
  ddp::comm::request_flight_dump_from_signal();
}

// --checkpoint-on-signal: SIGTERM (the launcher's, Slurm's or Kubernetes' stop) lets the ranks
// finish the step and checkpoint; the handler only sets a flag the training loop reads.
void on_sigterm(int /*signal*/) {
  ddp::train::request_stop_from_signal();
}

void handle(int signal_number, void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signal_number, &action, nullptr);
}

void install_signal_handlers(const ddp::train::Config& config) {
  handle(SIGUSR1, on_sigusr1);
  // A write past RLIMIT_FSIZE then fails with EFBIG, reported like a full disk; no kill.
  signal(SIGXFSZ, SIG_IGN);
  if (config.checkpoint_on_signal) handle(SIGTERM, on_sigterm);
}

// Note [Freed blocks go back to the system under --fsdp]
// glibc raises its mmap threshold to the size of each mapped block freed, up to 32 MiB, so that
// blocks under that size come from its heaps from then on, and a freed block stays there
// (resident) until the heap's top is trimmed. A sharded step frees many such blocks: each unit's
// optimizer temporaries, reduce-scatter scratch and gradient, a shard's size each. So a rank's
// resident memory came to hold, beside what was live, what its heaps had held at their fullest in
// other phases of the step: at 4 ranks on the wide MLP 611-744 MB over the baseline, varying with
// how the ranks' steps interleaved, where the same runs with the threshold fixed held 546-550 MB
// (docs/benchmarks.md, "Fully sharded data parallelism").
// With the threshold fixed (which also stops glibc from raising it), every block of 1 MiB or more
// is mapped and unmapped: resident memory follows what is live, at the cost of faulting in those
// blocks' pages each time. FSDP is for models that fit only when sharded, so it gets this; DDP,
// whose tensors are not sharded, keeps glibc's default.
void return_freed_blocks_to_the_system(const ddp::train::Config& config) {
  constexpr int kMmapThreshold = 1 << 20;
  if (sharded(ddp::train::parallel_mode(config))) mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
}

// In the launcher's warm spare (Note [A replacement forked from a warm spare] in
// ddp/common/fork_server.h): the workload made once, then a worker forked for each replacement the
// launcher asks for. Returns in a forked worker only, with that workload.
train::Workload serve_as_the_spare(const train::Config& config, int spare) {
  ddp::log::init(-1, "warn");
  if (config.sync_bn) {  // its layers need the group, which a spare's workload is made before
    throw ddp::InputError(
        "key 'sync-bn': a warm spare (the launcher's --warm-spare) cannot build it");
  }
  // LibTorch starts its intra-op threads when an operation first runs in parallel; the spare makes
  // its workload on its own thread only, so that it can fork (each worker sets its threads as
  // any worker does).
  train::set_intra_op_threads(1);
  train::Workload workload = train::make_workload(config);
  ddp::spare::serve(spare);
  ddp::log::init(rank_hint(ddp::comm::current_env()), config.log_level);
  return workload;
}

}  // namespace

int train_main(int argc, char** argv, const TrainRun& run) {
  const int rank = rank_hint(ddp::comm::current_env());
  ddp::log::init(rank, "info");
  try {
    ddp::train::Config config;
    if (!parse_command_line(argc, argv, config)) return ddp::kExitOk;
    ddp::log::init(rank, config.log_level);
    install_signal_handlers(config);
    return_freed_blocks_to_the_system(config);
    std::optional<train::Workload> preloaded;
    if (const auto spare = ddp::spare::spare_fd_from_env()) {
      preloaded = serve_as_the_spare(config, *spare);
    }
    const auto result = run(config, std::move(preloaded));
    return result.stopped_by_signal ? ddp::train::kExitStoppedBySignal : ddp::kExitOk;
  } catch (const ddp::Error& e) {
    ddp::log::error("{}", e.what());
    return e.exit_code();
  } catch (const c10::Error& e) {
    ddp::log::error("LibTorch: {}", e.what_without_backtrace());
    return ddp::kExitFailure;
  } catch (const std::exception& e) {
    ddp::log::error("{}", e.what());
    return ddp::kExitFailure;
  }
}

}  // namespace ddp::apps
