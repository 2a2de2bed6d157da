#include "options.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp::launch {
namespace {

// A setter's complaint; the caller adds which option and where it came from.
struct BadValue {
  std::string expected;
};

int parse_int(const std::string& text, int min, int max) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    throw BadValue{max == 65535 ? "a port number (1-65535)"
                   : min == 1   ? "a positive integer"
                                : fmt::format("an integer >= {}", min)};
  }
  return value;
}

double parse_seconds(const std::string& text, bool positive) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) ||
      (positive ? value <= 0 : value < 0)) {
    throw BadValue{positive ? "a number of seconds > 0" : "a number of seconds >= 0"};
  }
  return value;
}

// The words a flag takes as its value: 1|true|yes|on and 0|false|no|off; nullopt for others.
std::optional<bool> bool_word(const std::string& text) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  return std::nullopt;
}

bool parse_bool(const std::string& text) {
  const std::optional<bool> value = bool_word(text);
  if (!value) throw BadValue{"true or false"};
  return *value;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw BadValue{"a comma-separated list"};
    out.push_back(item);
  }
  if (out.empty()) throw BadValue{"a comma-separated list"};
  return out;
}

// What parsing collects before the options are checked together.
struct Parsed {
  LaunchOptions options;
  std::string nproc = "1";
  bool nproc_given = false;
};

struct Option {
  std::string name;
  std::string alias;  // or empty
  std::string hint;   // empty for a flag
  std::string help;
  std::function<void(Parsed&, const std::string&)> set;
};

const std::vector<Option>& options() {
  static const std::vector<Option> table = {
      {"nproc", "nproc-per-node", "N|auto", "processes on this node (auto: one per GPU, else 1)",
       [](Parsed& p, const std::string& v) {
         if (v != "auto") parse_int(v, 1, 1 << 16);
         p.nproc = v;
         p.nproc_given = true;
       }},
      {"nnodes", "", "N", "nodes in the job (one launcher each)",
       [](Parsed& p, const std::string& v) { p.options.nnodes = parse_int(v, 1, 1 << 16); }},
      {"node-rank", "", "N", "this node's rank, 0 .. nnodes-1",
       [](Parsed& p, const std::string& v) { p.options.node_rank = parse_int(v, 0, 1 << 16); }},
      {"master-addr", "", "HOST", "address of node 0 (default 127.0.0.1)",
       [](Parsed& p, const std::string& v) {
         if (v.empty()) throw BadValue{"a host name or address"};
         p.options.master_addr = v;
       }},
      {"master-port", "", "PORT",
       "port of the rendezvous on node 0 (default: a free one on one "
       "host, 29500 across nodes)",
       [](Parsed& p, const std::string& v) { p.options.master_port = parse_int(v, 1, 65535); }},
      {"max-restarts", "", "N", "restarts of the whole group after a worker fails (default 0)",
       [](Parsed& p, const std::string& v) { p.options.max_restarts = parse_int(v, 0, 1 << 20); }},
      {"monitor-interval", "", "SECONDS", "how often the workers are checked (default 0.1)",
       [](Parsed& p, const std::string& v) {
         p.options.monitor_interval = parse_seconds(v, true);
       }},
      {"grace-period", "", "SECONDS",
       "between SIGTERM and SIGKILL when stopping workers (default 5)",
       [](Parsed& p, const std::string& v) { p.options.grace_period = parse_seconds(v, false); }},
      {"log-dir", "", "DIR", "write each worker's output to DIR/rank<N>.log instead of the console",
       [](Parsed& p, const std::string& v) { p.options.log_dir = v; }},
      {"tee", "", "", "with --log-dir: the console too",
       [](Parsed& p, const std::string& v) { p.options.tee = parse_bool(v); }},
      {"local-ranks-filter", "", "LIST", "local ranks whose output the console shows (e.g. 0)",
       [](Parsed& p, const std::string& v) {
         p.options.local_ranks_filter.clear();
         for (const auto& item : split_list(v)) {
           p.options.local_ranks_filter.push_back(parse_int(item, 0, 1 << 16));
         }
       }},
      {"run-id", "", "ID", "job id, passed to the workers as TORCHELASTIC_RUN_ID (default none)",
       [](Parsed& p, const std::string& v) { p.options.run_id = v; }},
      {"devices", "", "LIST", "GPUs to use, one per local rank (sets CUDA_VISIBLE_DEVICES)",
       [](Parsed& p, const std::string& v) { p.options.devices = split_list(v); }},
      {"help", "", "", "print this help",
       [](Parsed& p, const std::string& v) { p.options.help = parse_bool(v); }},
  };
  return table;
}

const Option* find_option(const std::string& name) {
  for (const auto& o : options()) {
    if (o.name == name || (!o.alias.empty() && o.alias == name)) return &o;
  }
  return nullptr;
}

void apply(Parsed& p, const Option& o, const std::string& value, const std::string& origin) {
  try {
    o.set(p, value);
  } catch (const BadValue& bad) {
    throw InputError(fmt::format("{}: expected {}, got '{}'", origin, bad.expected, value));
  }
}

// Checks that need several options, and resolves --nproc auto.
LaunchOptions finish(Parsed p, const std::map<std::string, std::string>& env, int gpus_present) {
  LaunchOptions& o = p.options;
  if (o.help) return o;
  if (p.nproc == "auto") {
    auto visible = env.find("CUDA_VISIBLE_DEVICES");
    o.nproc = auto_nproc(visible == env.end() ? nullptr : visible->second.c_str(), gpus_present);
  } else {
    o.nproc = std::stoi(p.nproc);
  }
  if (!o.devices.empty()) {
    if (!p.nproc_given) o.nproc = static_cast<int>(o.devices.size());
    if (static_cast<int>(o.devices.size()) != o.nproc) {
      throw InputError(
          fmt::format("--devices lists {} GPU(s) for {} process(es) per node: give "
                      "one per local rank",
                      o.devices.size(), o.nproc));
    }
  }
  if (o.node_rank >= o.nnodes) {
    throw InputError(fmt::format("--node-rank {} is not below --nnodes {} (node ranks are 0 .. {})",
                                 o.node_rank, o.nnodes, o.nnodes - 1));
  }
  for (int r : o.local_ranks_filter) {
    if (r >= o.nproc) {
      throw InputError(
          fmt::format("--local-ranks-filter: local rank {} does not exist with "
                      "--nproc {}",
                      r, o.nproc));
    }
  }
  if (o.program.empty()) {
    throw InputError("no program to launch (usage: launcher [options] PROGRAM [ARGS...])");
  }
  return o;
}

}  // namespace

int auto_nproc(const char* cuda_visible_devices, int gpus_present) {
  if (cuda_visible_devices != nullptr) {
    const std::string visible = cuda_visible_devices;
    if (visible.empty()) return 1;
    return static_cast<int>(std::count(visible.begin(), visible.end(), ',')) + 1;
  }
  return std::max(gpus_present, 1);
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args,
                                const std::map<std::string, std::string>& env, int gpus_present) {
  Parsed p;
  // DDP_LAUNCH_<OPTION> first, so that the command line wins.
  const std::string env_prefix = "DDP_LAUNCH_";
  for (const auto& [key, value] : env) {
    if (key.rfind(env_prefix, 0) != 0) continue;
    std::string name = key.substr(env_prefix.size());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
      return c == '_' ? '-' : static_cast<char>(std::tolower(c));
    });
    const Option* o = find_option(name);
    if (o == nullptr) {
      throw InputError(fmt::format("{}: no launcher option --{} (see launcher --help)", key, name));
    }
    apply(p, *o, value, key);
  }

  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0) break;  // the program
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Option* o = find_option(name);
    if (o == nullptr) {
      throw InputError(fmt::format("unknown option '--{}' (see launcher --help)", name));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (o->hint.empty()) {
      // A flag: alone it means true; "--tee false" as "--tee=false" (ddp_train's rule). Any other
      // next word is the program, so only a bool word is taken: a program called true, false,
      // yes, no, on, off, 1 or 0 right after a flag goes after "--".
      value = i + 1 < args.size() && bool_word(args[i + 1]) ? args[++i] : "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw InputError(fmt::format("--{}: expected {} after it", name, o->hint));
    }
    apply(p, *o, value, "--" + name);
  }
  p.options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return finish(std::move(p), env, gpus_present);
}

std::string launch_help() {
  std::string out =
      "usage: launcher [options] PROGRAM [ARGS...]\n\n"
      "Starts --nproc copies of PROGRAM on this node with torchrun's environment (RANK, "
      "WORLD_SIZE,\n"
      "LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), shows their output prefixed with their rank,\n"
      "stops them all when one fails, and restarts the group up to --max-restarts times.\n"
      "Every option can also be set as DDP_LAUNCH_<OPTION> (e.g. DDP_LAUNCH_NPROC=4).\n"
      "A flag alone means true; --tee false and --tee=false turn it off (true|false, 1|0, "
      "yes|no,\n"
      "on|off); a program named like one of these words that follows a flag goes after --.\n\n"
      "options:\n";
  for (const auto& o : options()) {
    std::string left = "--" + o.name + (o.hint.empty() ? "" : " " + o.hint);
    if (!o.alias.empty()) left += ", --" + o.alias;
    out += fmt::format("  {:<36} {}\n", left, o.help);
  }
  return out;
}

std::map<std::string, std::string> worker_env(const LaunchOptions& o, int local_rank,
                                              int master_port, int restart_count,
                                              const std::map<std::string, std::string>& inherited) {
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(o.node_rank * o.nproc + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", o.run_id},
  };
  if (!o.job_token.empty()) env["DDP_JOB_TOKEN"] = o.job_token;
  if (!o.flight_dir.empty()) env["DDP_FLIGHT_DIR"] = o.flight_dir;
  // As torchrun (torch/distributed/run.py): several processes sharing the cores each get one
  // thread unless told otherwise.
  if (o.nproc > 1 && inherited.count("OMP_NUM_THREADS") == 0) env["OMP_NUM_THREADS"] = "1";
  // Python workers' rank 0 serves the store of init_process_group("env://"); PyTorch 2.4+ serves it
  // with libuv by default, which Debian's PyTorch 2.6 is built without ("use_libuv was requested
  // but PyTorch was build without libuv support"). The classic server is in every build and
  // ample for one job; the user's USE_LIBUV wins. Our own programs ignore the variable.
  if (inherited.count("USE_LIBUV") == 0) env["USE_LIBUV"] = "0";
  // All of them, in order, so that cuda:LOCAL_RANK is devices[LOCAL_RANK].
  if (!o.devices.empty()) {
    std::string list;
    for (const auto& d : o.devices) list += (list.empty() ? "" : ",") + d;
    env["CUDA_VISIBLE_DEVICES"] = list;
  }
  return env;
}

std::string choose_job_token(int nnodes, const std::map<std::string, std::string>& inherited,
                             const std::string& fresh) {
  if (auto it = inherited.find("DDP_JOB_TOKEN"); it != inherited.end() && !it->second.empty()) {
    return it->second;
  }
  return nnodes == 1 ? fresh : "";
}

bool catches_signal(const std::string& proc_status, int sig) {
  const std::string field = "\nSigCgt:";
  const size_t at = proc_status.find(field);
  if (at == std::string::npos || sig < 1 || sig > 64) return false;
  const size_t begin = proc_status.find_first_not_of(" \t", at + field.size());
  const size_t end = proc_status.find('\n', begin);
  const std::string hex = proc_status.substr(begin, end - begin);
  uint64_t mask = 0;
  const auto [ptr, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), mask, 16);
  if (ec != std::errc() || hex.empty()) return false;
  return ((mask >> (sig - 1)) & 1U) != 0;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return fmt::format("signal SIG{} ({})", abbrev ? abbrev : "?", sig);
  }
  return fmt::format("exit code {}", WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::optional<std::string> find_program(const std::string& program, const std::string& path) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    return std::nullopt;
  }
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (executable(candidate)) return candidate;
  }
  return std::nullopt;
}

}  // namespace ddp::launch
