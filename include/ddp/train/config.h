#pragma once
// The resolved settings of a training run, and the one table of keys behind the YAML file,
// the command line and --help: every key is settable from both, the command line wins.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddp/core/distributed_data_parallel.h"
#include "ddp/data/time_series.h"
#include "ddp/models/informer.h"
#include "ddp/train/lr_schedule.h"

namespace ddp::train {

// The keys whose values are names: an enum once parsed (set_config_value refuses any other text
// with "key 'optimizer': expected one of sgd|adam|adamw, got 'rmsprop'"). to_string gives the
// name the YAML file and the command line use.
enum class Optimizer { kSgd, kAdam, kAdamW };
enum class SavePrefix {
  kModule,  // model.pt's keys are "module." + name, as nn.DataParallel's state_dict
  kNone,    // the model's own names
};
// How DDP reduces gradients: the comm hook registered on the model (core/comm_hook.h).
enum class CommHook {
  kAllReduce,  // the average, in the gradients' dtype (no hook)
  kFp16,       // fp16_compress_hook
  kBf16,       // bf16_compress_hook
  kPowerSgd,   // powersgd_hook (core/powersgd.h)
};
// How the ranks keep the model (key parallel; the modes of src/train/parallel_mode.h): each a
// whole replica reduced every step (ddp), with the optimizer state sharded (zero: ZeRO-1),
// parameters, gradients and optimizer state sharded over every rank (fsdp) or over the ranks of a
// host and replicated across hosts (hsdp), each rank training alone between averages (local-sgd,
// diloco: core/diloco.h).
enum class Parallel { kDdp, kZero, kFsdp, kHsdp, kLocalSgd, kDiloco };
// Mixed precision (core/autocast.h): forward and loss under autocast in 16 bits.
enum class Amp {
  kOff,
  kBf16,  // bfloat16: float32's range, no loss scaling needed
  kFp16,  // float16, with a GradScaler (core/grad_scaler.h) against gradients that underflow
};
std::string to_string(Optimizer optimizer);  // sgd | adam | adamw
std::string to_string(LrScaling scaling);    // none | linear
std::string to_string(SavePrefix prefix);    // module | none
std::string to_string(CommHook hook);        // allreduce | fp16 | bf16 | powersgd
std::string to_string(Amp amp);              // off | bf16 | fp16
std::string to_string(Parallel mode);        // ddp | zero | fsdp | hsdp | local-sgd | diloco

struct Config {
  // What to train.
  std::string model = "mlp";
  std::string dataset = "fashion-mnist";
  std::string data;          // empty: the dataset's default (csv: the synthetic series)
  int64_t width = 4096;      // model wide-mlp: each hidden layer's
  int64_t depth = 6;         // model wide-mlp: hidden layers
  int64_t train_subset = 0;  // 0: all training samples
  int64_t test_subset = 0;   // 0: all test (and validation) samples
  // Time series (dataset csv): the loader's own options, with the Informer code's names and
  // defaults (keys date-column, target, features, seq-len, label-len, pred-len).
  data::TimeSeriesOptions time_series;
  // Informer's size, the model's own options (keys factor, d-model, n-heads, e-layers, d-layers,
  // d-ff, dropout; small defaults: a CPU epoch on 10,000 rows takes about a minute). Its lengths
  // are time_series' and its columns the data's: make_workload sets them when it makes the model.
  models::InformerOptions informer;
  // How long, in what batches.
  int64_t epochs = 1;
  int64_t batch_size = 64;        // per rank
  int64_t global_batch_size = 0;  // > 0: batch_size = this / world size (DataParallel's split)
  bool drop_last = false;         // drop each epoch's last batch when it is smaller
  bool uneven = false;            // no padding: ranks' shares differ, trained under Join
  int64_t grad_accum_steps = 1;   // micro-batches per optimizer step (no_sync for all but the last)
  int64_t workers = 0;            // loader threads preparing batches ahead (0: none)
  bool pin_memory = false;        // batches in pinned memory, copied without blocking (CUDA)
  bool augment = false;           // random crop (padding 4) and horizontal flip (images)
  // Optimizer and learning rate.
  Optimizer optimizer = Optimizer::kSgd;
  double lr = 0.02;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  Amp amp = Amp::kOff;
  double clip_grad_norm = 0.0;  // > 0: the reduced gradients' global 2-norm clipped to this
  std::string lr_schedule = "constant";
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t reference_batch = 256;
  double warmup_epochs = 0.0;
  int64_t lr_step_size = 30;
  double lr_gamma = 0.1;
  // Where and how it runs.
  int64_t seed = 0;
  std::string device = "auto";
  std::string backend = "auto";       // auto: comm::default_backend's
  double comm_timeout = 600.0;        // seconds a collective may wait for the other ranks
  double rendezvous_timeout = 300.0;  // seconds ranks wait for each other at start-up
  double stall_warning = 60.0;        // seconds a collective waits before a warning (0: none)
  int64_t check_params_every = 0;     // steps between cross-rank parameter checksums (0: never)
  bool checkpoint_on_signal = false;  // SIGTERM: finish the step, checkpoint, exit 143
  bool record_samples = false;        // rank 0 writes every committed step's sample ids
  // Before each collective, the ranks compare their calls (TORCH_DISTRIBUTED_DEBUG=DETAIL too).
  bool debug_collectives = false;
  // Hierarchical all-reduce (comm/hierarchical.h): auto (on when the ranks span several hosts,
  // as many on each, several on one), true (required), false.
  std::string hierarchical = "auto";
  // DistributedDataParallel, with PyTorch's names and defaults (the keys bucket-cap-mb,
  // first-bucket-mb, broadcast-buffers, find-unused-parameters, gradient-as-bucket-view).
  DistributedDataParallelOptions ddp;
  bool bucket_cap_auto = false;  // bucket-cap-mb auto: tuned in the first steps (bucket_tuning.h)
  CommHook comm_hook = CommHook::kAllReduce;
  int64_t powersgd_rank = 1;           // PowerSGDOptions::matrix_approximation_rank
  int64_t powersgd_start_iter = 1000;  // PowerSGDOptions::start_powerSGD_iter (PyTorch's default)
  bool sync_bn = false;                // BatchNorm statistics over the global batch (SyncBatchNorm)
  // How the ranks keep the model. ddp, the default, claims nothing: the older keys zero, fsdp and
  // sync (local-sgd, diloco) name a mode too, and parallel_mode() says which one the keys agree on.
  // A Trainer sets this to it at the start, and every mode-dependent part reads only this.
  Parallel parallel = Parallel::kDdp;
  bool zero = false;  // parallel zero: ZeroRedundancyOptimizer, optimizer state sharded (ZeRO-1)
  bool fsdp = false;  // parallel fsdp: parameters, gradients and optimizer sharded
  // --fsdp's mixed precision policy: the dtype units gather and compute in, and the one gradients
  // are reduce-scattered in; float32 or bfloat16 (reduce: also param-dtype, fsdp_param_dtype's).
  std::string fsdp_param_dtype = "float32";
  std::string fsdp_reduce_dtype = "param-dtype";
  // --fsdp: units free their gathered parameters after their forward (FullyShardOptions's
  // reshard_after_forward); false keeps them until the backward.
  bool reshard_after_forward = true;
  // --fsdp: each rank writes its shard of every checkpoint in the background (a directory of one
  // file per rank); model.pt is written gathered when the training ends.
  bool checkpoint_sharded = false;
  // --checkpoint-sharded: each rank's file written on a thread beside training, from a copy of its
  // state (PyTorch DCP's async_save); false: written before the next step, from the state itself
  // (DCP's save), which costs no memory beyond training's.
  bool checkpoint_async = true;
  // parallel local-sgd (each rank trains alone, models averaged every sync_every steps and at each
  // epoch's end) or diloco (the same with the paper's outer Nesterov step on the averaged change),
  // as the older key names them (core/diloco.h); ddp claims no mode.
  std::string sync = "ddp";
  int64_t sync_every = 50;
  int64_t sync_delay = 0;  // inner steps each synchronization's all-reduce overlaps (tau)
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool elastic = false;  // a lost rank's peers go on (under `launcher --nnodes MIN:MAX`)
  int64_t threads = 0;   // 0: leave LibTorch's default
  std::string output_dir = "runs/latest";
  std::string log_level = "info";
  std::string progress = "auto";  // auto | bar | lines | off (see train/progress.h)
  double progress_every = 30.0;   // seconds between progress lines in a log
  std::string timeline;           // "": none; else the Chrome trace written after the run
  // Straggler attribution (train/straggler.h): the ranks' step times exchanged every this many
  // steps, and the ratio over the other ranks' median that names a straggler (0: off).
  int64_t straggler_every = 50;
  double straggler_threshold = 2.0;
  int64_t eval_every = 1;  // epochs; 0: evaluate after the last epoch only
  // Checkpoints (rank 0 writes into output_dir).
  int64_t save_every = 1;  // epochs; 0: at the end only
  int64_t keep_last = 3;   // numbered checkpoints kept
  SavePrefix save_prefix = SavePrefix::kModule;
  std::string resume;        // "": start afresh; auto: newest valid checkpoint; or a path
  std::string init_weights;  // a weights file to start from (ours or Python's)
};

// One configurable key. `name` is the CLI and YAML name ("batch-size"); YAML also accepts
// "batch_size". `set` parses and checks a value and throws InputError saying what was expected.
struct ConfigKey {
  std::string name;
  std::string help;
  std::string value_hint;  // "INT", "FLOAT", "BOOL", "PATH", "a|b|c"
  bool is_flag = false;    // a bool: "--nesterov" alone means true
  std::function<void(Config&, const std::string& value)> set;
  std::function<std::string(const Config&)> get;
};

const std::vector<ConfigKey>& config_keys();

// The key called `name` ('_' and '-' are the same), or nullptr.
const ConfigKey* find_config_key(const std::string& name);

// The command line's words (argv without the program name) with every bool option in one form,
// "--key=value", so that the option parser needs no rule of its own for them: ddp::join_bool_values
// (ddp/common/bool_words.h) with this table's bool keys as the flags. A bool option accepts three
// spellings, as docs/training.md shows:
//   --augment          -> --augment=true
//   --augment false    -> --augment=false  (the next word is taken only when it is a bool:
//                                            true|false|yes|no|on|off|1|0, any case)
//   --augment=false    -> --augment=false
// Any other next word stays where it is: "--augment --epochs 3" keeps "--epochs 3", and a stray
// word is left for the parser to report. Words after "--" are not touched. Names are matched as
// the parser spells them ("--drop-last", not "--drop_last"). A pure function of `args`.
std::vector<std::string> join_bool_values(const std::vector<std::string>& args);

// Sets one key. `origin` says where the value came from ("configs/a.yaml:3", "command line") and
// starts every error message. Throws InputError on an unknown key or a bad value.
void set_config_value(Config& config, const std::string& key, const std::string& value,
                      const std::string& origin);

// Applies a YAML file (a mapping of key: scalar) on top of `config`.
// Throws InputError naming the file and line for syntax errors, unknown keys and bad values.
void apply_config_file(Config& config, const std::string& path);

// Whether `mode` shards the parameters (fsdp, hsdp).
inline bool sharded(Parallel mode) {
  return mode == Parallel::kFsdp || mode == Parallel::kHsdp;
}

// Whether the FSDP keys ask for a mixed precision policy.
inline bool fsdp_mixed_precision(const Config& config) {
  return config.fsdp_param_dtype != "float32" || config.fsdp_reduce_dtype != "param-dtype";
}

// The mode the keys parallel, fsdp, zero and sync name (ddp when none does). InputError naming two
// of them when they name different modes ("key 'fsdp': cannot be combined with parallel zero ...").
Parallel parallel_mode(const Config& config);

// The checks that need several keys at once (each key alone is checked as it is set): the model
// and the data that do not fit, each mode's rules (the mode's check_options), --elastic's and
// bucket-cap-mb auto's, the warmup. Throws InputError naming the keys. Defined with the modes'
// rules in src/train/validate.cpp.
void validate(const Config& config);

// The resolved configuration as YAML, one "key: value" line per key (loadable again).
std::string to_yaml(const Config& config);

}  // namespace ddp::train
