#include "ddp/train/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include "ddp/common/bool_words.h"
#include "ddp/common/error.h"
#include "ddp/common/whole_number.h"

namespace ddp::train {
namespace {

// A setter's complaint; set_config_value() adds where and which key.
struct BadValue {
  std::string expected;
};

int64_t parse_int(const std::string& text) {
  const auto value = whole_number(text, std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max());
  if (!value) throw BadValue{"an integer"};
  return *value;
}

double parse_float(const std::string& text) {
  if (text.empty()) throw BadValue{"a number"};
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) throw BadValue{"a finite number"};
  return value;
}

std::string format_float(double v) {
  return fmt::format("{}", v);
}

// The names of an enum's values, as the YAML file and the command line write them.
template <class E>
struct Named {
  E value;
  const char* name;
};
constexpr Named<Optimizer> kOptimizerNames[] = {
    {Optimizer::kSgd, "sgd"}, {Optimizer::kAdam, "adam"}, {Optimizer::kAdamW, "adamw"}};
constexpr Named<LrScaling> kLrScalingNames[] = {{LrScaling::kNone, "none"},
                                                {LrScaling::kLinear, "linear"}};
constexpr Named<SavePrefix> kSavePrefixNames[] = {{SavePrefix::kModule, "module"},
                                                  {SavePrefix::kNone, "none"}};
constexpr Named<CommHook> kCommHookNames[] = {{CommHook::kAllReduce, "allreduce"},
                                              {CommHook::kFp16, "fp16"},
                                              {CommHook::kBf16, "bf16"},
                                              {CommHook::kPowerSgd, "powersgd"}};
constexpr Named<Parallel> kParallelNames[] = {{Parallel::kDdp, "ddp"},
                                              {Parallel::kZero, "zero"},
                                              {Parallel::kFsdp, "fsdp"},
                                              {Parallel::kHsdp, "hsdp"},
                                              {Parallel::kLocalSgd, "local-sgd"},
                                              {Parallel::kDiloco, "diloco"}};
constexpr Named<Amp> kAmpNames[] = {{Amp::kOff, "off"}, {Amp::kBf16, "bf16"}, {Amp::kFp16, "fp16"}};

// "sgd|adam|adamw"
template <class E, size_t N>
std::string choices(const Named<E> (&names)[N]) {
  std::string joined;
  for (const auto& n : names) joined += (joined.empty() ? "" : "|") + std::string(n.name);
  return joined;
}

template <class E, size_t N>
std::optional<E> value_named(const Named<E> (&names)[N], const std::string& name) {
  for (const auto& n : names) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

template <class E, size_t N>
std::string name_of(const Named<E> (&names)[N], E value) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  throw Error(fmt::format("no name for value {} of an enum", static_cast<int>(value)));
}

// The builders below take `field`, the value a key sets: a member pointer (&Config::epochs) or a
// function returning a reference to it (the DDP options' accessors); std::invoke reaches either.

template <class Field>
ConfigKey int_key(std::string name, Field field, int64_t min, std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.help = std::move(help);
  key.value_hint = "INT";
  key.set = [field, min](Config& c, const std::string& v) {
    const int64_t value = parse_int(v);
    if (value < min) {
      throw BadValue{min == 1 ? "a positive integer" : fmt::format("an integer >= {}", min)};
    }
    std::invoke(field, c) = value;
  };
  key.get = [field](const Config& c) { return std::to_string(std::invoke(field, c)); };
  return key;
}

// A float key; the value must be > min (exclusive) or >= min.
template <class Field>
ConfigKey float_key(std::string name, Field field, double min, bool exclusive, std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.help = std::move(help);
  key.value_hint = "FLOAT";
  key.set = [field, min, exclusive](Config& c, const std::string& v) {
    const double value = parse_float(v);
    if (exclusive ? !(value > min) : !(value >= min)) {
      throw BadValue{fmt::format("a number {} {}", exclusive ? ">" : ">=", min)};
    }
    std::invoke(field, c) = value;
  };
  key.get = [field](const Config& c) { return format_float(std::invoke(field, c)); };
  return key;
}

template <class Field>
ConfigKey bool_key(std::string name, Field field, std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.help = std::move(help);
  key.value_hint = "BOOL";
  key.is_flag = true;
  key.set = [field](Config& c, const std::string& v) {
    // The common reading of bool words; the complaint goes through BadValue, as every key's does,
    // so that set_config_value names the origin and the key.
    const std::optional<bool> value = bool_word(v);
    if (!value) throw BadValue{"true or false"};
    std::invoke(field, c) = *value;
  };
  key.get = [field](const Config& c) {
    return std::string(std::invoke(field, c) ? "true" : "false");
  };
  return key;
}

// A string key; with `choices`, the value must be one of them.
template <class Field>
ConfigKey string_key(std::string name, Field field, std::vector<std::string> choices,
                     std::string hint, std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.help = std::move(help);
  std::string joined;
  for (const auto& choice : choices) joined += (joined.empty() ? "" : "|") + choice;
  key.value_hint = choices.empty() ? std::move(hint) : joined;
  key.set = [field, choices, joined](Config& c, const std::string& v) {
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
      throw BadValue{"one of " + joined};
    }
    std::invoke(field, c) = v;
  };
  key.get = [field](const Config& c) { return std::string(std::invoke(field, c)); };
  return key;
}

// A key whose value is one of the names of an enum's values (`names`, in --help's order).
template <class E, size_t N, class Field>
ConfigKey enum_key(std::string name, Field field, const Named<E> (&names)[N], std::string help) {
  ConfigKey key;
  key.name = std::move(name);
  key.help = std::move(help);
  key.value_hint = choices(names);
  key.set = [field, &names](Config& c, const std::string& v) {
    const std::optional<E> value = value_named(names, v);
    if (!value) throw BadValue{"one of " + choices(names)};
    std::invoke(field, c) = *value;
  };
  key.get = [field, &names](const Config& c) { return name_of(names, std::invoke(field, c)); };
  return key;
}

// A member of one of Config's option structs (`path`: "time_series.seq_len") as a key's field.
#define DDP_MEMBER(path) \
  [](auto& c) -> auto& { \
    return c.path;       \
  }

// The DDP options' field `name` as a key's field: a TORCH_ARG member, reached through its
// accessors (the const one for `get`, the other for `set`).
#define DDP_OPTION(name) \
  [](auto& c) -> auto& { \
    return c.ddp.name(); \
  }

// bucket-cap-mb: a float key that also takes "auto".
ConfigKey bucket_cap_key() {
  ConfigKey key = float_key(
      "bucket-cap-mb", DDP_OPTION(bucket_cap_mb), 0.0, true,
      "DDP: MiB of gradients per all-reduce bucket (the first: first-bucket-mb); auto: the first "
      "steps try sizes from 0.5 to 100 and keep the fastest (logged, kept in checkpoints)");
  key.value_hint = "FLOAT|auto";
  key.set = [number = key.set](Config& c, const std::string& v) {
    c.bucket_cap_auto = v == "auto";
    if (c.bucket_cap_auto) return;
    try {
      number(c, v);
    } catch (const BadValue&) {
      throw BadValue{"a number > 0 or auto"};
    }
  };
  key.get = [number = key.get](const Config& c) {
    return c.bucket_cap_auto ? std::string("auto") : number(c);
  };
  return key;
}

std::vector<ConfigKey> make_keys() {
  using C = Config;
  return {
      string_key("model", &C::model, {"mlp", "resnet18", "linear", "informer", "wide-mlp"}, "",
                 "model to train"),
      int_key("width", &C::width, 1, "wide-mlp: the width of each hidden layer"),
      int_key("depth", &C::depth, 1, "wide-mlp: the number of hidden layers"),
      string_key("dataset", &C::dataset, {"fashion-mnist", "random", "csv"}, "",
                 "dataset to train on"),
      string_key("data", &C::data, {}, "PATH",
                 "dataset location (fashion-mnist: a directory, empty: "
                 "/usr/share/datasets/fashion-mnist; csv: a file, empty: the synthetic series)"),
      int_key("train-subset", &C::train_subset, 0, "train on the first N samples only (0: all)"),
      int_key("test-subset", &C::test_subset, 0,
              "evaluate on the first N test (and validation) samples only (0: all)"),
      string_key("date-column", DDP_MEMBER(time_series.date_column), {}, "NAME",
                 "csv: the date column, source of the time features (absent: none)"),
      string_key("target", DDP_MEMBER(time_series.target), {}, "NAME",
                 "csv: the column to forecast (empty: the last)"),
      string_key("features", DDP_MEMBER(time_series.features), {"M", "S", "MS"}, "",
                 "csv: M all columns to all, S the target to itself, MS all columns to the target"),
      int_key("seq-len", DDP_MEMBER(time_series.seq_len), 1,
              "csv: rows of history the encoder reads"),
      int_key("label-len", DDP_MEMBER(time_series.label_len), 0,
              "csv: known rows the decoder starts from (at most seq-len)"),
      int_key("pred-len", DDP_MEMBER(time_series.pred_len), 1, "csv: rows to forecast"),
      int_key("factor", DDP_MEMBER(informer.factor), 1, "informer: ProbSparse sampling factor c"),
      int_key("d-model", DDP_MEMBER(informer.d_model), 2,
              "informer: model width (even, a multiple of n-heads)"),
      int_key("n-heads", DDP_MEMBER(informer.n_heads), 1, "informer: attention heads"),
      int_key("e-layers", DDP_MEMBER(informer.e_layers), 1, "informer: encoder layers"),
      int_key("d-layers", DDP_MEMBER(informer.d_layers), 1, "informer: decoder layers"),
      int_key("d-ff", DDP_MEMBER(informer.d_ff), 1, "informer: feed-forward width"),
      float_key("dropout", DDP_MEMBER(informer.dropout), 0.0, false,
                "informer: dropout probability, below 1"),
      int_key("epochs", &C::epochs, 1, "number of epochs"),
      int_key("batch-size", &C::batch_size, 1, "batch size per rank"),
      int_key("global-batch-size", &C::global_batch_size, 0,
              "the batch of all ranks together, split evenly over them (0: use batch-size)"),
      bool_key("drop-last", &C::drop_last, "drop each epoch's last batch when it is smaller"),
      bool_key("uneven", &C::uneven,
               "each rank trains on its share without padding (shares differ by one sample at "
               "most); a rank that runs out joins the others' steps (Join)"),
      int_key("grad-accum-steps", &C::grad_accum_steps, 1,
              "micro-batches of batch-size per optimizer step: gradients accumulate locally "
              "(no_sync) and are reduced once, at the last"),
      int_key("workers", &C::workers, 0, "loader threads preparing batches ahead (0: none)"),
      bool_key("pin-memory", &C::pin_memory,
               "batches in pinned memory, copied to the GPU without blocking"),
      bool_key("augment", &C::augment,
               "random crop with padding 4 and horizontal flip, seeded per rank and epoch"),
      enum_key("optimizer", &C::optimizer, kOptimizerNames, "optimizer"),
      float_key("lr", &C::lr, 0.0, true, "learning rate"),
      float_key("momentum", &C::momentum, 0.0, false, "SGD momentum"),
      bool_key("nesterov", &C::nesterov, "SGD with Nesterov momentum"),
      float_key("weight-decay", &C::weight_decay, 0.0, false,
                "weight decay (L2; decoupled for adamw)"),
      enum_key("amp", &C::amp, kAmpNames,
               "mixed precision: forward and loss under autocast in 16 bits (fp16 adds a "
               "GradScaler, whose state the checkpoints keep)"),
      float_key("clip-grad-norm", &C::clip_grad_norm, 0.0, false,
                "clip the reduced gradients' global 2-norm to this before each step, as "
                "torch.nn.utils.clip_grad_norm_ (0: no clipping)"),
      string_key("lr-schedule", &C::lr_schedule, {"constant", "step", "cosine"}, "",
                 "learning-rate schedule after warm-up"),
      enum_key("lr-scaling", &C::lr_scaling, kLrScalingNames,
               "linear: lr x global batch / reference-batch (Goyal et al.)"),
      int_key("reference-batch", &C::reference_batch, 1,
              "the global batch that lr is meant for (lr-scaling linear)"),
      float_key("warmup-epochs", &C::warmup_epochs, 0.0, false,
                "linear learning-rate warm-up, in epochs (fractions allowed)"),
      int_key("lr-step-size", &C::lr_step_size, 1, "step schedule: epochs between decays"),
      float_key("lr-gamma", &C::lr_gamma, 0.0, true, "step schedule: decay factor"),
      int_key("seed", &C::seed, 0, "random seed (model init, shuffling)"),
      string_key("device", &C::device, {"auto", "cpu", "cuda"}, "",
                 "device (auto: cuda if available)"),
      string_key("backend", &C::backend, {"auto", "local", "gloo", "shm", "mpi", "nccl"}, "",
                 "process-group backend (auto: nccl on CUDA; on CPU shm, which is gloo across "
                 "hosts, mpi under mpirun across hosts; local at world size 1)"),
      float_key("comm-timeout", &C::comm_timeout, 0.0, true,
                "seconds a collective waits for the other ranks before failing"),
      float_key("rendezvous-timeout", &C::rendezvous_timeout, 0.0, true,
                "seconds the ranks wait for each other at start-up"),
      float_key("stall-warning", &C::stall_warning, 0.0, false,
                "seconds a collective may wait before a warning names the ranks that have not "
                "joined it (0: none)"),
      int_key("check-params-every", &C::check_params_every, 0,
              "every N steps, check that the ranks' parameters are still equal (0: never)"),
      bool_key("checkpoint-on-signal", &C::checkpoint_on_signal,
               "on SIGTERM, every rank finishes its step, rank 0 writes a checkpoint, and the "
               "run exits with 143 (--resume auto continues from that step)"),
      bool_key("debug-collectives", &C::debug_collectives,
               "before each collective, the ranks compare what they call (op, dtype, shape) and "
               "a mismatch ends every rank at once naming both calls, as "
               "TORCH_DISTRIBUTED_DEBUG=DETAIL (which also turns it on); one small all-gather "
               "per collective"),
      string_key("hierarchical", &C::hierarchical, {"auto", "true", "false"}, "",
                 "all-reduce within each host first, then across hosts among one rank per host "
                 "and local rank, then within the host again (auto: when the ranks span several "
                 "hosts with as many ranks on each, more than one on a host)"),
      bool_key("record-samples", &C::record_samples,
               "rank 0 writes the sample ids every rank trained in each committed step to "
               "samples.jsonl in the output directory (one all_gather a step)"),
      bucket_cap_key(),
      float_key("first-bucket-mb", DDP_OPTION(first_bucket_mb), 0.0, true,
                "DDP: MiB of the first bucket (the last layers' gradients, reduced first)"),
      bool_key("broadcast-buffers", DDP_OPTION(broadcast_buffers),
               "DDP: broadcast rank 0's buffers (BatchNorm statistics) before each forward"),
      bool_key("find-unused-parameters", DDP_OPTION(find_unused_parameters),
               "DDP: allow parameters that get no gradient in an iteration"),
      bool_key("gradient-as-bucket-view", DDP_OPTION(gradient_as_bucket_view),
               "DDP: gradients live in the all-reduce buckets (saves a copy and memory)"),
      enum_key("parallel", &C::parallel, kParallelNames,
               "how the ranks keep the model: ddp (each a replica, gradients all-reduced every "
               "step), zero (the optimizer state sharded), fsdp (parameters, gradients and "
               "optimizer state sharded), hsdp (sharded within each host, replicated across "
               "hosts), local-sgd or diloco (each rank trains alone between averages); the keys "
               "zero, fsdp and sync name the same modes"),
      bool_key("zero", &C::zero,
               "ZeRO stage 1 (ZeroRedundancyOptimizer): each rank keeps the optimizer state of "
               "its shard of the parameters only"),
      bool_key("fsdp", &C::fsdp,
               "fully sharded data parallelism (FSDP): each rank keeps 1/N of every layer's "
               "parameters, gradients and optimizer state; a layer is gathered whole only while "
               "its forward or backward runs"),
      string_key("fsdp-param-dtype", &C::fsdp_param_dtype, {"float32", "bfloat16"}, "",
                 "FSDP: the dtype layers are gathered and computed in (bfloat16: mixed precision; "
                 "the shards and the optimizer stay float32)"),
      string_key("fsdp-reduce-dtype", &C::fsdp_reduce_dtype, {"param-dtype", "float32", "bfloat16"},
                 "", "FSDP: the dtype gradients are reduce-scattered in"),
      bool_key("reshard-after-forward", &C::reshard_after_forward,
               "FSDP: layers give their gathered parameters back after their forward and gather "
               "them again for the backward (false: kept from the forward to the backward, less "
               "communication, more memory)"),
      bool_key("checkpoint-sharded", &C::checkpoint_sharded,
               "FSDP: each rank writes its shard of every checkpoint in the background "
               "(checkpoint-epoch-N.shards/, resumable on any number of ranks); model.pt is "
               "written gathered when the training ends"),
      bool_key("checkpoint-async", &C::checkpoint_async,
               "FSDP, checkpoint-sharded: each rank's file written on a thread while training goes "
               "on, from a copy of the rank's state held until written (false: written before the "
               "next step, from the state itself, no copy)"),
      string_key("sync", &C::sync, {"ddp", "local-sgd", "diloco"}, "",
                 "ddp: gradients all-reduced every step; local-sgd: each rank trains alone and "
                 "the models are averaged every sync-every steps and at each epoch's end; diloco: "
                 "the same with DiLoCo's outer step (Nesterov SGD on the averaged change)"),
      int_key("sync-every", &C::sync_every, 1,
              "local-sgd, diloco: inner steps between synchronizations (H)"),
      int_key("sync-delay", &C::sync_delay, 0,
              "local-sgd, diloco: the last N inner steps before each synchronization run while "
              "its all-reduce is in flight (Streaming DiLoCo's tau; below sync-every)"),
      float_key("outer-lr", &C::outer_lr, 0.0, true, "diloco: the outer optimizer's lr"),
      float_key("outer-momentum", &C::outer_momentum, 0.0, false,
                "diloco: the outer optimizer's Nesterov momentum"),
      bool_key("sync-bn", &C::sync_bn,
               "BatchNorm statistics over the global batch (SyncBatchNorm), for small batches"),
      enum_key("comm-hook", &C::comm_hook, kCommHookNames,
               "DDP: how gradients are reduced (fp16/bf16: half the bytes on the wire; "
               "powersgd: low-rank compression, PyTorch's powerSGD_hook)"),
      int_key("powersgd-rank", &C::powersgd_rank, 1,
              "PowerSGD: rank of the approximation (matrix_approximation_rank)"),
      int_key("powersgd-start-iter", &C::powersgd_start_iter, 2,
              "PowerSGD: steps of plain all-reduce first (start_powerSGD_iter; PyTorch advises "
              "about 10% of training)"),
      bool_key("elastic", &C::elastic,
               "survive a lost rank: the others drop the step in flight, form a smaller group and "
               "go on; a restarted worker joins at a step (needs launcher --nnodes MIN:MAX)"),
      int_key("threads", &C::threads, 0,
              "intra-op threads per process (0: LibTorch's default, fewer where this host's ranks "
              "would share cores)"),
      string_key("output-dir", &C::output_dir, {}, "PATH", "directory for metrics and checkpoints"),
      string_key("log-level", &C::log_level, {"trace", "debug", "info", "warn", "error", "off"}, "",
                 "log level of rank 0"),
      string_key("progress", &C::progress, {"auto", "bar", "lines", "off"}, "",
                 "rank 0's progress in an epoch: a bar redrawn on a terminal, or log lines "
                 "(auto: the bar on a terminal, lines otherwise and under mpirun)"),
      float_key("progress-every", &C::progress_every, 0.0, true,
                "seconds between progress lines in a log"),
      string_key("timeline", &C::timeline, {}, "PATH",
                 "write a Chrome trace of every rank's steps and all-reduces to PATH after the run "
                 "(chrome://tracing, ui.perfetto.dev)"),
      int_key("straggler-every", &C::straggler_every, 1,
              "steps between the exchanges of the ranks' step times that name a straggler"),
      float_key("straggler-threshold", &C::straggler_threshold, 0.0, false,
                "name a rank a straggler when its computation, data wait or collectives take "
                "this many times the other ranks' median over a window (0: off)"),
      int_key("eval-every", &C::eval_every, 0,
              "evaluate every N epochs (0: after the last epoch only)"),
      int_key("save-every", &C::save_every, 0,
              "write a checkpoint every N epochs (0: after the last epoch only)"),
      int_key("keep-last", &C::keep_last, 1, "numbered checkpoints to keep"),
      enum_key("save-prefix", &C::save_prefix, kSavePrefixNames,
               "keys of model.pt: 'module.' + name as nn.DataParallel, or the names alone"),
      string_key("resume", &C::resume, {}, "auto|PATH",
                 "continue from a checkpoint (auto: the newest valid one in the output dir)"),
      string_key("init-weights", &C::init_weights, {}, "PATH",
                 "start from the weights in a file saved by Python or by ddp_train"),
  };
}

#undef DDP_OPTION

std::string canonical(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

std::string to_string(Optimizer optimizer) {
  return name_of(kOptimizerNames, optimizer);
}
std::string to_string(LrScaling scaling) {
  return name_of(kLrScalingNames, scaling);
}
std::string to_string(SavePrefix prefix) {
  return name_of(kSavePrefixNames, prefix);
}
std::string to_string(CommHook hook) {
  return name_of(kCommHookNames, hook);
}

std::string to_string(Parallel mode) {
  return name_of(kParallelNames, mode);
}

std::string to_string(Amp amp) {
  return name_of(kAmpNames, amp);
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_keys();
  return keys;
}

const ConfigKey* find_config_key(const std::string& name) {
  const std::string wanted = canonical(name);
  for (const auto& key : config_keys()) {
    if (key.name == wanted) return &key;
  }
  return nullptr;
}

std::vector<std::string> join_bool_values(const std::vector<std::string>& args) {
  return ddp::join_bool_values(args, [](const std::string& name) {
    // The parser's exact spelling, as --help shows it ("--drop-last", not "--drop_last").
    const auto& keys = config_keys();
    return std::any_of(keys.begin(), keys.end(),
                       [&](const ConfigKey& k) { return k.is_flag && k.name == name; });
  });
}

void set_config_value(Config& config, const std::string& key, const std::string& value,
                      const std::string& origin) {
  const ConfigKey* k = find_config_key(key);
  if (k == nullptr) {
    std::string known;
    for (const auto& candidate : config_keys())
      known += (known.empty() ? "" : ", ") + candidate.name;
    throw InputError(fmt::format("{}: unknown key '{}' (known keys: {})", origin, key, known));
  }
  try {
    k->set(config, value);
  } catch (const BadValue& bad) {
    throw InputError(
        fmt::format("{}: key '{}': expected {}, got '{}'", origin, k->name, bad.expected, value));
  }
}

void apply_config_file(Config& config, const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw InputError(fmt::format("{}: config file not found", path));
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    // yaml-cpp lines are 0-based.
    throw InputError(fmt::format("{}:{}:{}: YAML syntax error: {}", path, e.mark.line + 1,
                                 e.mark.column + 1, e.msg));
  }
  if (root.IsNull()) return;  // an empty file sets nothing
  if (!root.IsMap()) {
    throw InputError(
        fmt::format("{}:{}: expected a mapping of key: value", path, root.Mark().line + 1));
  }
  for (const auto& item : root) {
    const std::string origin = fmt::format("{}:{}", path, item.first.Mark().line + 1);
    if (!item.first.IsScalar()) {  // YAML allows "? [a, b]: 1"; a config key is a name
      throw InputError(fmt::format("{}: expected a key name, got a {}", origin,
                                   item.first.IsSequence() ? "list" : "mapping or null"));
    }
    const std::string key = item.first.Scalar();
    if (!item.second.IsScalar()) {
      if (find_config_key(key) == nullptr)
        set_config_value(config, key, "", origin);  // unknown key
      throw InputError(fmt::format("{}: key '{}': expected a single value, got a {}", origin, key,
                                   item.second.IsSequence() ? "list" : "mapping or null"));
    }
    set_config_value(config, key, item.second.Scalar(), origin);
  }
}

std::string to_yaml(const Config& config) {
  std::ostringstream out;
  for (const auto& key : config_keys()) {
    out << key.name << ": " << YAML::Dump(YAML::Node(key.get(config))) << "\n";
  }
  return out.str();
}

}  // namespace ddp::train
