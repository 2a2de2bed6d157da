#pragma once
// Which rank is slow, and why. DDP's all-reduce makes every rank's step take the same wall time,
// so a slow rank looks like the others; what differs is where each rank's time went. Each rank
// splits its steps into the time it waited for data, the time it computed (forward and backward
// up to its last gradient, not counting time blocked in collectives), the time blocked in
// collectives (the slow rank waits least), and the optimizer's. Every --straggler-every steps the
// ranks exchange their sums over that window (one all_gather of a few numbers); rank 0 scores
// each rank against the median of the others and names a straggler with its cause. The decision
// logic here is pure: the trainer measures and exchanges, this file judges and words.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::train {

// One rank's seconds over a window of steps (or one step's).
struct StepTimes {
  double data_s = 0.0;       // waiting for the step's batches
  double compute_s = 0.0;    // forward and backward, time blocked in collectives excluded
  double comm_s = 0.0;       // blocked in collectives (issuing them and waiting for them)
  double optimizer_s = 0.0;  // the optimizer step, its collectives excluded (counted in comm_s)

  StepTimes& operator+=(const StepTimes& o);
  // What the rank spent on its own work: data, compute and the optimizer.
  double busy_s() const { return data_s + compute_s + optimizer_s; }
};

// The figures exchanged: the window's sums, as 4 doubles, and back.
std::vector<double> to_doubles(const StepTimes& t);
StepTimes step_times_from(const double* values);

enum class StragglerCause { kComputation, kDataLoading, kCommunication };
const char* cause_name(StragglerCause cause);  // "computation", "data loading", "communication"

struct StragglerVerdict {
  int rank = -1;
  StragglerCause cause = StragglerCause::kComputation;
  double ratio = 0.0;      // the rank's figure of that cause over the others' median
  double rank_ms = 0.0;    // per step
  double median_ms = 0.0;  // the others' median, per step
};

// Below this excess over the others' median (per step) no rank is a straggler, whatever the
// ratio: on steps of a fraction of a millisecond, a preemption or two would pass any ratio.
constexpr double kStragglerMinExcessMs = 1.0;

// The straggler of a window where every rank ran `steps` steps (`ranks`: each rank's sums), at
// `threshold` (a ratio over the median of the other ranks; 0: never). Computation (with the
// optimizer) and data loading are judged first: the rank with the largest ratio of either, at
// least `threshold` and kStragglerMinExcessMs a step above the median, is the straggler, for
// that cause. Only when none is, a rank blocked in collectives `threshold` times the others'
// median, by at least a tenth of their step, and not faster than them at its own work, is one
// for communication (a rank that computes slowly makes the others wait, so their collective time
// says nothing then). nullopt: none. A pure function.
std::optional<StragglerVerdict> find_straggler(const std::vector<StepTimes>& ranks, int64_t steps,
                                               double threshold);

// Rank 0's lines. Steps `first`..`last` (1-based, inclusive) are the window.
// "straggler: rank 1 computes 2.9x slower than the median of the other ranks over steps 101-150
// (forward+backward+optimizer 41.0 ms vs 14.0 ms a step); data and network normal"
std::string straggler_message(const StragglerVerdict& v, int64_t first, int64_t last);
// "straggler: rank 1 recovered over steps 151-200 (busy 14.2 ms a step, the others' median
// 14.0 ms)"
std::string recovered_message(int rank, const std::vector<StepTimes>& ranks, int64_t steps,
                              int64_t first, int64_t last);

// The end of a run: a line per rank with its mean ms a step over every window exchanged
// ("rank  data ms  compute ms  comm ms  optimizer ms  busy/median"), the header first.
std::vector<std::string> straggler_table(const std::vector<StepTimes>& ranks, int64_t steps);

// Rank 0's record of the windows: the straggler named (so that it is named once, and its
// recovery told), and every rank's sums over the run and over the epoch.
class StragglerRecord {
 public:
  explicit StragglerRecord(double threshold) : threshold_(threshold) {}
  struct Lines {
    std::string warning;  // a straggler named ("" for none)
    std::string info;     // the one named before recovered ("" for none)
  };
  // The window of steps `last_step - steps + 1`..`last_step`, every rank's sums. A world of
  // another size (an elastic change) starts the sums afresh.
  Lines add_window(const std::vector<StepTimes>& ranks, int64_t steps, int64_t last_step);
  void begin_epoch();
  // Every rank's sums and their steps, over the run or over this epoch's windows.
  const std::vector<StepTimes>& run() const { return run_; }
  int64_t run_steps() const { return run_steps_; }
  const std::vector<StepTimes>& epoch() const { return epoch_; }
  int64_t epoch_steps() const { return epoch_steps_; }
  // The straggler named in this epoch's windows, the last one (nullopt: none).
  const std::optional<StragglerVerdict>& epoch_straggler() const { return epoch_straggler_; }

 private:
  double threshold_;
  std::optional<StragglerVerdict> named_;
  std::optional<StragglerVerdict> epoch_straggler_;
  std::vector<StepTimes> run_, epoch_;
  int64_t run_steps_ = 0, epoch_steps_ = 0;
};

}  // namespace ddp::train
