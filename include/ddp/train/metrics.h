#pragma once
// Per-epoch metrics, written as JSON lines (one object per epoch) into the output directory.

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "ddp/train/straggler.h"

namespace ddp::train {

// The figures of one pass over an evaluation set (every sample counted once over all ranks).
struct Scores {
  double loss = 0.0;                 // mean cross-entropy (classification) or MSE (regression)
  std::optional<double> accuracy;    // classification
  std::optional<double> mae;         // regression
  std::optional<double> naive_loss;  // the naive forecast's MSE and MAE (time series)
  std::optional<double> naive_mae;
};

// --elastic: a change of the group's members, in the metrics of the epoch where the first step
// after it was committed.
struct MembershipRecord {
  int64_t after_step = 0;  // the last step committed before the change
  std::string why;         // "step 6 dropped", "a worker joins", ...
  std::string lost;        // the launcher's notice of the member lost ("" for none)
  int64_t generation = 0;  // the new generation
  int64_t world_before = 0;
  int64_t world_after = 0;
  double recovery_seconds = 0.0;  // from the change seen to the first step committed after it
};

struct EpochMetrics {
  int64_t epoch = 0;           // 1-based
  int64_t steps = 0;           // optimizer steps so far
  double lr = 0.0;             // at the epoch's last step
  double train_loss = 0.0;     // mean over the epoch's samples
  std::optional<Scores> val;   // when evaluated, for workloads with a validation split
  std::optional<Scores> test;  // when evaluated (with a validation split: after the last epoch)
  double samples_per_s = 0.0;  // training samples (all ranks) per second of training time
  double epoch_seconds = 0.0;  // training time, evaluation excluded
  // Bytes rank 0 handed to the gradients' collectives per step (ProcessGroup::bytes_issued:
  // the payload; 0 on one rank without a comm hook). What compression hooks save.
  double grad_bytes_per_step = 0.0;
  std::vector<MembershipRecord> membership_changes;  // --elastic
  // Every rank's step times summed over the straggler windows exchanged in this epoch (rank 0's
  // record, straggler.h), over rank_times_steps steps; and the straggler named in them.
  std::vector<StepTimes> rank_times;
  int64_t rank_times_steps = 0;
  std::optional<StragglerVerdict> straggler;
};

// One JSON object on one line: {"epoch":1,"steps":938,"lr":0.1,"train_loss":...,
// "val_loss", "val_mae", "test_loss", "test_accuracy", "test_mae", "naive_test_loss",
// "naive_test_mae", "samples_per_s", "epoch_seconds", "grad_bytes_per_step"}, in this order, and
// "membership_changes" (a list of objects with MembershipRecord's fields) where there were any,
// "rank_step_ms" (per rank: {"rank","data","compute","comm","optimizer"}, ms a step) where
// straggler windows ended in the epoch, and "straggler" ({"rank","cause","ratio","rank_ms",
// "median_ms"}) where one was named; an absent value (or NaN, infinity) is null. Figures to 9
// significant digits, the two timings to 6.
std::string to_json(const EpochMetrics& m);

// The epoch's log line: "train loss 0.3, test loss 0.4, test accuracy 0.9, ..." with the figures
// it has.
std::string describe(const EpochMetrics& m);

// The lines of a JSON-lines record (metrics.jsonl, samples.jsonl) whose integer field `key` is
// at most `last`, as written, byte for byte: what a run resumed there keeps, so that no epoch or
// step appears twice. A line that is not such an object (cut short by a crash) is dropped.
std::string records_up_to(const std::string& jsonl, const std::string& key, int64_t last);
// records_up_to(jsonl, "epoch", last_epoch).
std::string metrics_up_to(const std::string& jsonl, int64_t last_epoch);

class MetricsWriter {
 public:
  // Truncates `path`, or appends to it. Throws InputError when it cannot be opened.
  explicit MetricsWriter(std::string path, bool append = false);
  // Appends one line and flushes, so a crash keeps every finished epoch.
  void write(const EpochMetrics& m);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace ddp::train
