// Config: YAML files, command-line overrides through the same key table, and every bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>
#include <vector>

#include "built_paths.h"
#include "ddp/common/error.h"
#include "ddp/train/config.h"
#include "ddp/train/train_state.h"
#include "errors.h"
#include "subprocess.h"

namespace {

using ddp::testing::input_error_of;

using ddp::InputError;
using ddp::testing::TempDir;
using ddp::train::Config;

Config load(const TempDir& dir, const std::string& yaml) {
  ddp::testing::write_file(dir.file("c.yaml"), yaml);
  Config c;
  ddp::train::apply_config_file(c, dir.file("c.yaml"));
  return c;
}

TEST(Config, LoadsEveryKindOfValue) {
  TempDir dir;
  Config c = load(dir,
                  "model: linear\ndataset: random\nepochs: 3\nbatch_size: 15\nlr: 0.5\n"
                  "nesterov: yes\nweight-decay: 1e-4\nlr-schedule: cosine\noutput-dir: /tmp/x\n");
  EXPECT_EQ(c.model, "linear");
  EXPECT_EQ(c.dataset, "random");
  EXPECT_EQ(c.epochs, 3);
  EXPECT_EQ(c.batch_size, 15);
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_TRUE(c.nesterov);
  EXPECT_DOUBLE_EQ(c.weight_decay, 1e-4);
  EXPECT_EQ(c.lr_schedule, "cosine");
  EXPECT_EQ(c.output_dir, "/tmp/x");
  EXPECT_EQ(c.momentum, Config().momentum);  // untouched keys keep their defaults
}

TEST(Config, CommandLineOverridesTheFile) {
  TempDir dir;
  Config c = load(dir, "epochs: 3\nlr: 0.5\n");
  ddp::train::set_config_value(c, "epochs", "7", "command line");
  EXPECT_EQ(c.epochs, 7);
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
}

TEST(Config, UnknownKeyNamesFileAndLine) {
  TempDir dir;
  const auto msg = input_error_of([&] { load(dir, "epochs: 3\n\nbatchsize: 4\n"); });
  EXPECT_NE(msg.find(dir.file("c.yaml") + ":3: unknown key 'batchsize'"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndExpectation) {
  TempDir dir;
  auto msg = input_error_of([&] { load(dir, "epochs: three\n"); });
  EXPECT_NE(msg.find(":1: key 'epochs': expected an integer, got 'three'"), std::string::npos)
      << msg;
  msg = input_error_of([&] { load(dir, "nesterov: maybe\n"); });
  EXPECT_NE(msg.find("key 'nesterov': expected true or false, got 'maybe'"), std::string::npos)
      << msg;
  msg = input_error_of([&] { load(dir, "optimizer: rmsprop\n"); });
  EXPECT_NE(msg.find("key 'optimizer': expected one of sgd|adam|adamw, got 'rmsprop'"),
            std::string::npos)
      << msg;
  msg = input_error_of([&] { load(dir, "lr: [1, 2]\n"); });
  EXPECT_NE(msg.find("key 'lr': expected a single value, got a list"), std::string::npos) << msg;
  msg = input_error_of([&] { load(dir, "epochs: 2.5\n"); });
  EXPECT_NE(msg.find("expected an integer, got '2.5'"), std::string::npos) << msg;
}

TEST(Config, NonPositiveBatchSizeAndLr) {
  Config c;
  auto msg =
      input_error_of([&] { ddp::train::set_config_value(c, "batch-size", "0", "command line"); });
  EXPECT_EQ(msg, "command line: key 'batch-size': expected a positive integer, got '0'");
  msg = input_error_of([&] { ddp::train::set_config_value(c, "lr", "-0.1", "command line"); });
  EXPECT_EQ(msg, "command line: key 'lr': expected a number > 0, got '-0.1'");
  msg = input_error_of([&] { ddp::train::set_config_value(c, "lr", "nan", "command line"); });
  EXPECT_EQ(msg, "command line: key 'lr': expected a finite number, got 'nan'");
  msg = input_error_of(
      [&] { ddp::train::set_config_value(c, "bucket-cap-mb", "fast", "command line"); });
  EXPECT_EQ(msg, "command line: key 'bucket-cap-mb': expected a number > 0 or auto, got 'fast'");
  ddp::train::set_config_value(c, "bucket-cap-mb", "auto", "command line");
  EXPECT_TRUE(c.bucket_cap_auto);
  ddp::train::set_config_value(c, "bucket-cap-mb", "5", "command line");
  EXPECT_FALSE(c.bucket_cap_auto);
  EXPECT_EQ(c.ddp.bucket_cap_mb(), 5);
}

// Every bool option (the key table's, so a new one is covered too), in the three spellings
// docs/training.md shows, with each word parse_bool knows; the joined "--key=value" is what
// cxxopts hands to set_config_value. A next word that is no bool is never taken as the value.
TEST(Config, EveryBoolOptionTakesTheFlagTheSpacedAndTheEqualsForm) {
  using ddp::train::join_bool_values;
  using Words = std::vector<std::string>;
  int bools = 0;
  for (const auto& key : ddp::train::config_keys()) {
    if (!key.is_flag) continue;
    ++bools;
    const std::string flag = "--" + key.name;
    const std::vector<std::pair<Words, bool>> cases = {
        {{flag}, true},           {{flag, "false"}, false},
        {{flag, "true"}, true},   {{flag, "0"}, false},
        {{flag, "1"}, true},      {{flag, "no"}, false},
        {{flag, "YES"}, true},    {{flag, "off"}, false},
        {{flag, "on"}, true},     {{flag + "=false"}, false},
        {{flag + "=true"}, true}, {{flag + "=No"}, false}};
    for (const auto& [words, expected] : cases) {
      const Words joined = join_bool_values(words);
      ASSERT_EQ(joined.size(), 1u) << words.back();
      const auto eq = joined[0].find('=');
      ASSERT_NE(eq, std::string::npos) << joined[0];
      EXPECT_EQ(joined[0].substr(0, eq), flag);
      Config c;
      key.set(c, expected ? "false" : "true");  // the field starts at the other value
      ddp::train::set_config_value(c, joined[0].substr(2, eq - 2), joined[0].substr(eq + 1),
                                   "command line");
      EXPECT_EQ(key.get(c), expected ? "true" : "false") << words.front() << " " << words.back();
    }
    EXPECT_EQ(join_bool_values({flag, "--epochs", "3"}), (Words{flag + "=true", "--epochs", "3"}));
    EXPECT_EQ(join_bool_values({"--epochs", "3", flag}), (Words{"--epochs", "3", flag + "=true"}));
    EXPECT_EQ(join_bool_values({flag, "maybe"}), (Words{flag + "=true", "maybe"}));
    EXPECT_EQ(join_bool_values({"--", flag, "false"}), (Words{"--", flag, "false"}));
  }
  EXPECT_GE(bools, 9);
  // Other options' values are theirs, even when they read like a bool.
  const Words others = {"--output-dir", "true", "--timeline", "off", "--drop_last", "false", "-h"};
  EXPECT_EQ(join_bool_values(others), others);
  // A bad value names the key and the value.
  Config c;
  EXPECT_EQ(
      input_error_of([&] { ddp::train::set_config_value(c, "augment", "maybe", "command line"); }),
      "command line: key 'augment': expected true or false, got 'maybe'");
}

TEST(Config, SyntaxErrorNamesLine) {
  TempDir dir;
  const auto msg = input_error_of([&] { load(dir, "epochs: 1\nlr: [0.1\n"); });
  EXPECT_NE(msg.find(dir.file("c.yaml") + ":"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

// Found by fuzz_config: a YAML complex key ("? key") is a mapping, not a name; reading it as a
// string threw a YAML exception that was not an InputError.
TEST(Config, AKeyThatIsNotANameIsAnInputError) {
  TempDir dir;
  EXPECT_EQ(input_error_of([&] { load(dir, "epochs: 1\n? a: /usd\n"); }),
            dir.file("c.yaml") + ":2: expected a key name, got a mapping or null");
  EXPECT_EQ(input_error_of([&] { load(dir, "? [a, b]\n: 3\n"); }),
            dir.file("c.yaml") + ":1: expected a key name, got a list");
}

TEST(Config, MissingFileAndNonMapping) {
  TempDir dir;
  Config c;
  EXPECT_EQ(input_error_of([&] { ddp::train::apply_config_file(c, dir.file("none.yaml")); }),
            dir.file("none.yaml") + ": config file not found");
  EXPECT_NE(input_error_of([&] { load(dir, "- a\n- b\n"); }).find("expected a mapping"),
            std::string::npos);
}

TEST(Config, CrossKeyValidation) {
  Config c;
  c.model = "linear";
  EXPECT_NE(input_error_of([&] {
              ddp::train::validate(c);
            }).find("model 'linear' trains on dataset 'random'"),
            std::string::npos);
  c = Config();
  c.warmup_epochs = 2;
  EXPECT_NE(input_error_of([&] { ddp::train::validate(c); }).find("warmup-epochs"),
            std::string::npos);
  // --sync local-sgd and diloco: the ranks' models differ between synchronizations.
  c = Config();
  c.sync = "diloco";
  EXPECT_NO_THROW(ddp::train::validate(c));
  c.zero = true;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'sync': diloco cannot be combined with zero");
  c.zero = false;
  c.check_params_every = 10;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'sync': diloco cannot be combined with check-params-every");
  c.check_params_every = 0;
  c.sync_every = 10;
  c.sync_delay = 9;
  EXPECT_NO_THROW(ddp::train::validate(c));
  c.sync_delay = 10;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'sync-delay': 10 is not below sync-every (10)");
  c.sync = "ddp";
  c.sync_delay = 1;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'sync-delay': needs sync local-sgd or diloco");
  // --bucket-cap-mb auto: the ranks re-bucket at steps they count alike, with the plain all-reduce.
  c = Config();
  c.bucket_cap_auto = true;
  EXPECT_NO_THROW(ddp::train::validate(c));
  c.sync = "local-sgd";
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'bucket-cap-mb': auto cannot be combined with sync local-sgd (no all-reduce per "
            "step to tune)");
  c.sync = "ddp";
  c.comm_hook = ddp::train::CommHook::kPowerSgd;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'bucket-cap-mb': auto cannot be combined with comm-hook powersgd (its state is "
            "per bucket)");
  c = Config();
  c.outer_momentum = 1.0;
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'outer-momentum': 1 is not below 1");
}

TEST(Config, ReshardAfterForwardReachesTheShardingOptionsAndNeedsFsdp) {
  Config c;
  EXPECT_TRUE(ddp::train::fsdp_options(c).reshard_after_forward());
  ddp::train::set_config_value(c, "reshard-after-forward", "false", "command line");
  EXPECT_FALSE(ddp::train::fsdp_options(c).reshard_after_forward());
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'reshard-after-forward' needs fsdp");
  c.fsdp = true;
  EXPECT_NO_THROW(ddp::train::validate(c));
}

TEST(Config, CheckpointAsyncFalseNeedsShardedCheckpoints) {
  Config c;
  c.fsdp = true;
  ddp::train::set_config_value(c, "checkpoint-async", "false", "command line");
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(c); }),
            "key 'checkpoint-async' false needs checkpoint-sharded (a gathered checkpoint is "
            "written before training goes on)");
  c.checkpoint_sharded = true;
  EXPECT_NO_THROW(ddp::train::validate(c));
}

TEST(Config, YamlRoundTripsEveryKey) {
  TempDir dir;
  Config c;
  c.model = "linear";
  c.dataset = "random";
  c.lr = 0.125;
  c.nesterov = true;
  c.data = "";
  c.output_dir = "out dir: with colon";
  c.bucket_cap_auto = true;
  Config back = load(dir, ddp::train::to_yaml(c));
  for (const auto& key : ddp::train::config_keys()) {
    EXPECT_EQ(key.get(back), key.get(c)) << key.name;
  }
}

TEST(Config, ShippedConfigsLoadAndValidate) {
  int checked = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DDP_SOURCE_DIR) + "/configs")) {
    Config c;
    ddp::train::apply_config_file(c, entry.path().string());
    EXPECT_NO_THROW(ddp::train::validate(c)) << entry.path();
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// The key parallel names how the ranks keep the model; fsdp, zero and sync name the same modes and
// agree with it or are refused, naming both keys. The rules follow the mode whichever key named it.
TEST(Config, ParallelNamesTheModeAndTheOlderKeysAreItsAliases) {
  using ddp::train::Parallel;
  using ddp::train::parallel_mode;
  using ddp::train::set_config_value;
  Config c;
  EXPECT_EQ(parallel_mode(c), Parallel::kDdp);
  EXPECT_NE(ddp::train::to_yaml(c).find("\nparallel: ddp\n"), std::string::npos);
  for (const auto& [key, value, mode] : std::vector<std::tuple<std::string, std::string, Parallel>>{
           {"parallel", "zero", Parallel::kZero},
           {"parallel", "fsdp", Parallel::kFsdp},
           {"parallel", "local-sgd", Parallel::kLocalSgd},
           {"parallel", "diloco", Parallel::kDiloco},
           {"zero", "true", Parallel::kZero},
           {"fsdp", "true", Parallel::kFsdp},
           {"sync", "local-sgd", Parallel::kLocalSgd},
           {"sync", "diloco", Parallel::kDiloco}}) {
    Config one;
    set_config_value(one, key, value, "command line");
    EXPECT_EQ(parallel_mode(one), mode) << key << " " << value;
    EXPECT_NO_THROW(ddp::train::validate(one)) << key << " " << value;
  }
  set_config_value(c, "parallel", "fsdp", "command line");
  set_config_value(c, "fsdp", "true", "configs/a.yaml:3");
  EXPECT_EQ(parallel_mode(c), Parallel::kFsdp);  // the alias agrees
  set_config_value(c, "parallel", "zero", "command line");
  EXPECT_EQ(input_error_of([&] { parallel_mode(c); }),
            "key 'fsdp': cannot be combined with parallel zero (FSDP shards the optimizer state "
            "already)");
  Config d;
  set_config_value(d, "sync", "local-sgd", "command line");
  set_config_value(d, "parallel", "diloco", "command line");
  EXPECT_EQ(input_error_of([&] { ddp::train::validate(d); }),
            "key 'sync': local-sgd cannot be combined with parallel diloco (each names how the "
            "ranks keep the model: write one)");
  Config e;
  set_config_value(e, "parallel", "fsdp", "command line");
  e.uneven = true;
  EXPECT_NE(input_error_of([&] {
              ddp::train::validate(e);
            }).find("key 'parallel': fsdp cannot be combined with uneven"),
            std::string::npos);
  e.uneven = false;
  set_config_value(e, "hierarchical", "true", "command line");  // accepted before, doing nothing
  EXPECT_NE(input_error_of([&] {
              ddp::train::validate(e);
            }).find("key 'parallel': fsdp cannot be combined with hierarchical true"),
            std::string::npos);
  EXPECT_NE(input_error_of([&] {
              set_config_value(e, "parallel", "ring", "command line");
            }).find("expected one of ddp|zero|fsdp|hsdp|local-sgd|diloco, got 'ring'"),
            std::string::npos);
}

}  // namespace
