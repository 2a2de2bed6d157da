#pragma once
// Rank 0's progress within an epoch (--progress). On a terminal: one line per epoch, redrawn in
// place ("\r") a few times a second and left standing when the epoch ends. Elsewhere (a log
// file, a launcher's pipe, under mpirun): a plain log line every --progress-every seconds, which
// reads well in a file and never fills it with redraws.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace ddp::train {

enum class ProgressStyle { kBar, kLines, kOff };

// --progress auto|bar|lines|off: auto is a bar on a terminal and lines elsewhere; ranks other
// than 0 show none. `is_terminal`: isatty(stdout). `under_mpirun`: the ranks were started by
// mpirun (comm::Launcher::kMpirun), whose ranks' stdout is a pseudo-terminal whatever mpirun's
// own output is (a file, a pipe), so that isatty cannot tell: auto means lines there (--progress
// bar still draws one). A pure function.
ProgressStyle progress_style(const std::string& setting, bool is_terminal, bool under_mpirun,
                             bool is_main);

struct ProgressState {
  int64_t epoch = 1, epochs = 1;  // 1-based
  int64_t step = 0, steps = 0;    // steps of this epoch done, and in all
  double loss = 0.0;              // mean training loss of the epoch so far
  double samples_per_s = 0.0;     // this rank's samples times the world size, per second
  double elapsed_s = 0.0;         // since the epoch started
  int64_t timed_steps = 0;        // steps within elapsed_s (a resumed epoch skipped some)
};

// "1:02:03" or "2:05" (minutes:seconds below an hour).
std::string format_duration(double seconds);
// Seconds left at the epoch's rate so far; 0 when done or before the first step.
double eta_seconds(const ProgressState& s);
// The terminal's line, `width` characters of bar:
// "epoch 2/5 [=======>       ] 312/938 loss 0.4231 1234 samples/s ETA 0:42"; when the epoch is
// done, "in 1:03" replaces the ETA.
std::string progress_bar(const ProgressState& s, int width = 24);
// The log's line: "epoch 2/5: step 312/938 (33%), loss 0.4231, 1234 samples/s, ETA 0:42".
std::string progress_line(const ProgressState& s);

// One epoch's progress. `update` is cheap when nothing is due; `loss` is only called when a line
// is shown (on CUDA it waits for the device).
class EpochProgress {
 public:
  using Clock = std::chrono::steady_clock;
  EpochProgress(ProgressStyle style, double every_s, int64_t epoch, int64_t epochs, int64_t steps,
                int world_size);
  // After step `step` (1-based, of this epoch) with `samples` trained by this rank so far.
  void update(int64_t step, int64_t samples, const std::function<double()>& loss);
  // The bar's final state and its newline, so that each epoch leaves its line (bars only).
  void finish(int64_t samples, const std::function<double()>& loss);

 private:
  ProgressState state(int64_t step, int64_t samples, double loss) const;

  ProgressStyle style_;
  double every_s_;
  int64_t epoch_, epochs_, steps_;
  int world_size_;
  int64_t first_step_ = -1;  // a resumed epoch starts later: rates count this run's steps only
  int64_t last_step_ = 0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_shown_ = start_;
};

}  // namespace ddp::train
