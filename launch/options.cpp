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
#include <cxxopts.hpp>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "ddp/common/bool_words.h"
#include "ddp/common/error.h"
#include "ddp/common/whole_number.h"
#include "scheduler_env.h"

namespace ddp::launch {
namespace {

// A setter's complaint; the caller adds which option and where it came from.
struct BadValue {
  std::string expected;
};

int parse_int(const std::string& text, int min, int max) {
  if (const auto value = whole_number(text, min, max)) return *value;
  throw BadValue{max == 65535 ? "a port number (1-65535)"
                 : min == 1   ? "a positive integer"
                              : fmt::format("an integer >= {}", min)};
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
  std::set<std::string> given;  // the options set, by their first names
};

// --nnodes N, or MIN:MAX (torchrun's elastic syntax).
void parse_nnodes(Parsed& p, const std::string& v) {
  const size_t colon = v.find(':');
  if (colon == std::string::npos) {
    p.options.nnodes = parse_int(v, 1, 1 << 16);
    return;
  }
  const int low = parse_int(v.substr(0, colon), 1, 1 << 16);
  const int high = parse_int(v.substr(colon + 1), 1, 1 << 16);
  if (low > high) throw BadValue{"MIN:MAX with MIN at most MAX"};
  p.options.min_nnodes = low;
  p.options.nnodes = high;
  p.options.elastic = true;
}

// The setters too long for a line of the table.
void set_nproc(Parsed& p, const std::string& v) {
  if (v != "auto" && v != "cpu" && v != "gpu") {
    try {
      parse_int(v, 1, 1 << 16);
    } catch (const BadValue&) {
      throw BadValue{"a positive integer, auto, cpu or gpu"};
    }
  }
  p.nproc = v;
  p.nproc_given = true;
}

void set_master_addr(Parsed& p, const std::string& v) {
  if (v.empty()) throw BadValue{"a host name or address"};
  p.options.master_addr = v;
}

// torchrun's --rdzv-endpoint HOST[:PORT]: node 0's address, and the port where given. An IPv6
// address with a port is written in brackets ([::1]:29500).
void set_rdzv_endpoint(Parsed& p, const std::string& v) {
  std::string host = v;
  std::string port;
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string::npos) throw BadValue{"HOST[:PORT]"};
    host = v.substr(1, close - 1);
    if (close + 1 < v.size()) {
      if (v[close + 1] != ':') throw BadValue{"HOST[:PORT]"};
      port = v.substr(close + 2);
    }
  } else if (const size_t colon = v.find(':');
             colon != std::string::npos && v.find(':', colon + 1) == std::string::npos) {
    host = v.substr(0, colon);
    port = v.substr(colon + 1);
  }
  set_master_addr(p, host);
  if (!port.empty() || v.back() == ':') p.options.master_port = parse_int(port, 1, 65535);
}

void set_local_ranks_filter(Parsed& p, const std::string& v) {
  p.options.local_ranks_filter.clear();
  for (const auto& item : split_list(v)) {
    p.options.local_ranks_filter.push_back(parse_int(item, 0, 1 << 16));
  }
}

struct Option {
  std::string name;
  std::string alias;  // or empty
  std::string hint;   // empty for a flag
  std::string help;
  // An option with a value: parses and stores it, or throws BadValue.
  std::function<void(Parsed&, const std::string&)> set;
  // A flag instead (set is then empty): stores the value that parse_bool read.
  std::function<void(Parsed&, bool)> set_flag = nullptr;
  bool is_flag() const { return static_cast<bool>(set_flag); }
};

const std::vector<Option>& options() {
  static const std::vector<Option> table = {
      {"nproc", "nproc-per-node", "N|auto|cpu|gpu",
       "processes on this node (auto: one per GPU, else 1; cpu: one per online core, one thread "
       "each; gpu: one per GPU)",
       set_nproc},
      {"nnodes", "", "N|MIN:MAX",
       "nodes in the job (one launcher each); MIN:MAX: elastic (a failed worker is restarted "
       "alone and joins the running group; the job goes on while MIN nodes are in it)",
       parse_nnodes},
      {"node-rank", "", "N", "this node's rank, 0 .. nnodes-1",
       [](Parsed& p, const std::string& v) { p.options.node_rank = parse_int(v, 0, 1 << 16); }},
      {"master-addr", "", "HOST", "address of node 0 (default 127.0.0.1)", set_master_addr},
      {"rdzv-endpoint", "", "HOST[:PORT]", "torchrun's spelling of --master-addr and --master-port",
       set_rdzv_endpoint},
      {"master-port", "", "PORT",
       "port of the rendezvous on node 0 (default: a free one on one "
       "host, 29500 across nodes)",
       [](Parsed& p, const std::string& v) { p.options.master_port = parse_int(v, 1, 65535); }},
      {"max-restarts", "", "N",
       "restarts of the whole group after a worker fails (default 0); elastic (MIN:MAX), per "
       "node: a lost worker of ddp_train --elastic restarted alone counts one, and so does every "
       "worker started again from the newest checkpoint when none holds the group's state; any "
       "other program's group is restarted whole, as torchrun's agent does",
       [](Parsed& p, const std::string& v) { p.options.max_restarts = parse_int(v, 0, 1 << 20); }},
      {"warm-spare", "", "",
       "elastic, ddp_train only: keep one more copy of the program loaded (LibTorch, the data, "
       "the model) and fork each restarted worker from it, which spares the restart a process's "
       "start",
       nullptr, [](Parsed& p, bool v) { p.options.warm_spare = v; }},
      {"monitor-interval", "", "SECONDS", "how often the workers are checked (default 0.1)",
       [](Parsed& p, const std::string& v) {
         p.options.monitor_interval = parse_seconds(v, true);
       }},
      {"node-timeout", "", "SECONDS",
       "elastic, several nodes: a node not heard from for this long is out of the group, its "
       "workers with it, until it is back (default 15)",
       [](Parsed& p, const std::string& v) { p.options.node_timeout = parse_seconds(v, true); }},
      {"rdzv-timeout", "", "SECONDS",
       "how long a node other than node 0 waits for --master-addr to resolve, as a pod's DNS "
       "name does once the pod is ready (default 600, torchrun's join timeout)",
       [](Parsed& p, const std::string& v) { p.options.rdzv_timeout = parse_seconds(v, true); }},
      {"grace-period", "", "SECONDS",
       "between SIGTERM and SIGKILL when stopping workers (default 5)",
       [](Parsed& p, const std::string& v) { p.options.grace_period = parse_seconds(v, false); }},
      {"log-dir", "", "DIR", "write each worker's output to DIR/rank<N>.log instead of the console",
       [](Parsed& p, const std::string& v) { p.options.log_dir = v; }},
      {"tee", "", "", "with --log-dir: the console too", nullptr,
       [](Parsed& p, bool v) { p.options.tee = v; }},
      {"local-ranks-filter", "", "LIST", "local ranks whose output the console shows (e.g. 0)",
       set_local_ranks_filter},
      {"run-id", "rdzv-id", "ID",
       "job id, passed to the workers as TORCHELASTIC_RUN_ID (default none)",
       [](Parsed& p, const std::string& v) { p.options.run_id = v; }},
      {"devices", "", "LIST", "GPUs to use, one per local rank (sets CUDA_VISIBLE_DEVICES)",
       [](Parsed& p, const std::string& v) { p.options.devices = split_list(v); }},
      {"help", "", "", "print this help", nullptr, [](Parsed& p, bool v) { p.options.help = v; }},
  };
  return table;
}

const Option* find_option(const std::string& spelt) {
  std::string name = spelt;
  std::replace(name.begin(), name.end(), '_', '-');
  for (const auto& o : options()) {
    if (o.name == name || (!o.alias.empty() && o.alias == name)) return &o;
  }
  return nullptr;
}

void apply(Parsed& p, const Option& o, const std::string& value, const std::string& origin) {
  p.given.insert(o.name);
  if (o.is_flag()) {
    o.set_flag(p, parse_bool(value, origin));
    return;
  }
  try {
    o.set(p, value);
  } catch (const BadValue& bad) {
    throw InputError(fmt::format("{}: expected {}, got '{}'", origin, bad.expected, value));
  }
}

// <prefix><OPTION>: the option's name in upper case with '_' for '-'. An unknown name is an
// error under our own prefix; torchrun's PET_ variables also carry its options we do not have
// (PET_RDZV_BACKEND, PET_RDZV_CONF, ...), which are left alone and named at start.
void apply_env(Parsed& p, const std::map<std::string, std::string>& env, const std::string& prefix,
               bool ours) {
  for (const auto& [key, value] : env) {
    if (key.rfind(prefix, 0) != 0) continue;
    std::string name = key.substr(prefix.size());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
      return c == '_' ? '-' : static_cast<char>(std::tolower(c));
    });
    const Option* o = find_option(name);
    if (o == nullptr && ours) {
      throw InputError(fmt::format("{}: no launcher option --{} (see launcher --help)", key, name));
    }
    if (o == nullptr) {
      p.options.ignored_env.push_back(key);
      continue;
    }
    apply(p, *o, value, key);
    p.options.read_from.push_back(key);
  }
}

// The command line cut where the launcher's options end.
struct CommandLine {
  std::vector<std::string> options;  // the launcher's words, "--" excluded
  std::vector<std::string> program;  // the program and its arguments, untouched
  std::string error;                 // why the options ended early (a bad word); "": they did not
};

// The options end at "--" or at the first word that is not one. cxxopts reads options wherever
// they are, so the cut is made here, before it sees the words: the program's arguments are
// never the launcher's, even when they look like its options. Finding the cut needs each
// option's arity, so an unknown option or a missing value ends the options too, with an error
// in our words that the caller raises after the options before it (the first bad word on the
// line is the one reported). An option's name spelt with '_' is rewritten with '-' for cxxopts.
CommandLine split_command_line(const std::vector<std::string>& args) {
  CommandLine line;
  std::vector<std::string> words = args;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--" && args[i].rfind("--", 0) == 0; ++i) {
    const std::string& arg = args[i];
    const size_t eq = arg.find('=');
    const auto name_end = static_cast<std::ptrdiff_t>(eq == std::string::npos ? arg.size() : eq);
    std::replace(words[i].begin() + 2, words[i].begin() + name_end, '_', '-');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Option* o = find_option(name);
    if (o == nullptr) {
      line.error = fmt::format("unknown option '--{}' (see launcher --help)", name);
      break;
    }
    if (eq != std::string::npos) continue;
    const bool has_next = i + 1 < args.size();
    if (o->is_flag()) {
      // Alone it means true; the next word is its value only when it is a bool word, as
      // join_bool_values reads it. Any other next word is the next option or the program, so
      // a program called true, false, yes, no, on, off, 1 or 0 right after a flag goes after "--".
      if (bool_value_follows(args, i)) ++i;
    } else if (has_next) {
      ++i;  // the value, whatever it looks like ("--run-id --tee" names the run "--tee")
    } else {
      line.error = fmt::format("--{}: expected {} after it", name, o->hint);
      break;
    }
  }
  line.options.assign(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(i));
  if (i < args.size() && args[i] == "--") ++i;
  line.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return line;
}

// The cxxopts parser of the table: every option (an alias as one of its own, so that errors name
// the spelling given) takes a string, which apply() checks; a flag alone means true.
cxxopts::Options make_cli() {
  cxxopts::Options cli("launcher", "torchrun's job for any program");
  auto adder = cli.add_options();
  for (const auto& o : options()) {
    for (const std::string& name : {o.name, o.alias}) {
      if (name.empty()) continue;
      auto value = cxxopts::value<std::string>();
      if (o.is_flag()) value->implicit_value("true");
      adder(name, o.help, value, o.hint);
    }
  }
  return cli;
}

// Applies the launcher's words (split_command_line's options) through cxxopts.
void apply_command_line(Parsed& p, const std::vector<std::string>& words) {
  // cxxopts reads a flag only alone or as "--tee=false": "--tee false" is joined first. The
  // values of the other options stay theirs, even when they read like a flag.
  std::vector<std::string> joined = join_bool_values(
      words,
      [](const std::string& name) {
        const Option* o = find_option(name);
        return o != nullptr && o->is_flag();
      },
      [](const std::string& name) {
        const Option* o = find_option(name);
        return o != nullptr && !o->is_flag();
      });
  joined.insert(joined.begin(), "launcher");
  std::vector<const char*> argv;
  for (const auto& word : joined) argv.push_back(word.c_str());
  cxxopts::Options cli = make_cli();
  cxxopts::ParseResult result;
  try {
    result = cli.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw InputError(fmt::format("command line: {} (see launcher --help)", e.what()));
  }
  // In the order given, so that the last of repeated options (or of --nproc and its alias) wins.
  for (const auto& given : result.arguments()) {
    apply(p, *find_option(given.key()), given.value(), "--" + given.key());
  }
}

// --nproc auto, gpu, cpu or a number. cpu counts the online cores as torchrun does
// (os.cpu_count()), whatever this process's affinity or a container's CPU limit: each worker then
// gets OMP_NUM_THREADS=1 (worker_env).
int resolve_nproc(const Parsed& p, const std::map<std::string, std::string>& env,
                  int gpus_present, int host_cores) {
  auto visible = env.find("CUDA_VISIBLE_DEVICES");
  const int gpus = auto_nproc(visible == env.end() ? nullptr : visible->second.c_str(),
                              gpus_present);
  if (p.nproc == "auto") return gpus;
  if (p.nproc == "cpu") return std::max(host_cores, 1);
  if (p.nproc == "gpu") {
    if (gpus_present == 0 || (visible != env.end() && visible->second.empty())) {
      throw InputError("--nproc gpu: no GPU is visible on this node");
    }
    return gpus;
  }
  return std::stoi(p.nproc);
}

// Where no option set them: the job's shape from the scheduler's own variables.
void apply_scheduler_shape(Parsed& p, const std::map<std::string, std::string>& env) {
  const auto given = [&](const char* name) { return p.given.count(name) != 0; };
  const bool shape_given = given("nproc") || given("nnodes") || given("node-rank");
  const SchedulerShape shape =
      read_scheduler_shape(env, shape_given, given("node-rank"), p.options.nnodes);
  LaunchOptions& o = p.options;
  if (shape.nnodes) o.nnodes = *shape.nnodes;
  if (shape.node_rank) o.node_rank = *shape.node_rank;
  if (shape.nproc) p.nproc = std::to_string(*shape.nproc);
  o.given_local_rank = shape.local_rank.value_or(-1);
  o.given_local_world_size = shape.local_world_size.value_or(-1);
  o.given_group_rank = shape.group_rank.value_or(-1);
  const bool endpoint = given("rdzv-endpoint");
  if (shape.master_addr && !endpoint && !given("master-addr")) o.master_addr = *shape.master_addr;
  if (shape.master_port && !endpoint && !given("master-port")) o.master_port = *shape.master_port;
  if (!shape.contract.empty()) o.read_from.push_back(shape.contract);
}

// Checks that need several options, and resolves --nproc.
LaunchOptions finish(Parsed p, const std::map<std::string, std::string>& env, int gpus_present,
                     int host_cores) {
  LaunchOptions& o = p.options;
  if (o.help) return o;
  apply_scheduler_shape(p, env);
  o.nproc = resolve_nproc(p, env, gpus_present, host_cores);
  if (!o.devices.empty()) {
    if (!p.nproc_given) o.nproc = static_cast<int>(o.devices.size());
    if (static_cast<int>(o.devices.size()) != o.nproc) {
      throw InputError(
          fmt::format("--devices lists {} GPU(s) for {} process(es) per node: give "
                      "one per local rank",
                      o.devices.size(), o.nproc));
    }
  }
  if (o.warm_spare && !o.elastic) {
    throw InputError(
        "--warm-spare: only an elastic job (--nnodes MIN:MAX) restarts a worker alone");
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
                                const std::map<std::string, std::string>& env, int gpus_present,
                                int host_cores) {
  Parsed p;
  // Lowest first, each over the one before: torchrun's variables, ours, the command line.
  apply_env(p, env, "PET_", false);
  apply_env(p, env, "DDP_LAUNCH_", true);
  CommandLine line = split_command_line(args);
  apply_command_line(p, line.options);
  if (!line.error.empty()) throw InputError(line.error);
  p.options.program = std::move(line.program);
  return finish(std::move(p), env, gpus_present, host_cores);
}

std::string launch_help() {
  std::string out =
      "usage: launcher [options] PROGRAM [ARGS...]\n\n"
      "Starts --nproc copies of PROGRAM on this node with torchrun's environment (RANK, "
      "WORLD_SIZE,\n"
      "LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), shows their output prefixed with their rank,\n"
      "stops them all when one fails, and restarts the group up to --max-restarts times.\n"
      "Every option can also be set as DDP_LAUNCH_<OPTION> (e.g. DDP_LAUNCH_NPROC=4) or as\n"
      "torchrun's PET_<OPTION> (e.g. PET_NPROC_PER_NODE=4); the command line wins, then\n"
      "DDP_LAUNCH_, then PET_. Where none sets --nproc, --nnodes or --node-rank, a scheduler's\n"
      "RANK and WORLD_SIZE mean one process here (rank RANK of WORLD_SIZE), and NODE_RANK this\n"
      "node's rank.\n"
      "A flag alone means true; --tee false and --tee=false turn it off (true|false, 1|0, "
      "yes|no,\n"
      "on|off, in any case); a program named like one of these words that follows a flag goes\n"
      "after --.\n\n"
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
  const int local_world = o.given_local_world_size > 0 ? o.given_local_world_size : o.nproc;
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(o.node_rank * o.nproc + local_rank)},
      {"LOCAL_RANK", std::to_string(o.given_local_rank >= 0 ? o.given_local_rank : local_rank)},
      {"GROUP_RANK", std::to_string(o.given_group_rank >= 0 ? o.given_group_rank : o.node_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
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
  if (local_world > 1 && inherited.count("OMP_NUM_THREADS") == 0) env["OMP_NUM_THREADS"] = "1";
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

std::map<std::string, std::string> warm_spare_env(
    const LaunchOptions& options, int master_port,
    const std::map<std::string, std::string>& inherited) {
  auto env = inherited;
  env.erase("RANK");
  const auto worker = worker_env(options, 0, master_port, 0, inherited);
  for (const char* key : {"OMP_NUM_THREADS", "USE_LIBUV", "WORLD_SIZE"}) {
    if (worker.count(key) != 0) env[key] = worker.at(key);
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
