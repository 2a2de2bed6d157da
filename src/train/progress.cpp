#include "ddp/train/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ddp/common/log.h"

namespace ddp::train {

ProgressStyle progress_style(const std::string& setting, bool is_terminal, bool under_mpirun,
                             bool is_main) {
  if (!is_main || setting == "off") return ProgressStyle::kOff;
  if (setting == "bar") return ProgressStyle::kBar;
  if (setting == "lines") return ProgressStyle::kLines;
  // Open MPI relays each rank's output through a pseudo-terminal of its own, so isatty says yes
  // even when mpirun writes to a file; redraws would fill that file. Lines read well either way.
  return is_terminal && !under_mpirun ? ProgressStyle::kBar : ProgressStyle::kLines;
}

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

double eta_seconds(const ProgressState& s) {
  if (s.timed_steps <= 0 || s.step >= s.steps) return 0.0;
  return static_cast<double>(s.steps - s.step) * s.elapsed_s / static_cast<double>(s.timed_steps);
}

namespace {
std::string time_part(const ProgressState& s) {
  return s.step >= s.steps ? "in " + format_duration(s.elapsed_s)
                           : "ETA " + format_duration(eta_seconds(s));
}
}  // namespace

std::string progress_bar(const ProgressState& s, int width) {
  const double done = s.steps > 0 ? static_cast<double>(s.step) / static_cast<double>(s.steps) : 0;
  const int filled = std::clamp(static_cast<int>(done * width), 0, width);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(static_cast<size_t>(width), ' ');
  return fmt::format("epoch {}/{} [{}] {}/{} loss {:.4f} {:.0f} samples/s {}", s.epoch, s.epochs,
                     bar, s.step, s.steps, s.loss, s.samples_per_s, time_part(s));
}

std::string progress_line(const ProgressState& s) {
  const double percent = s.steps > 0 ? 100.0 * static_cast<double>(s.step) / s.steps : 0.0;
  return fmt::format("epoch {}/{}: step {}/{} ({:.0f}%), loss {:.4f}, {:.0f} samples/s, {}",
                     s.epoch, s.epochs, s.step, s.steps, std::floor(percent), s.loss,
                     s.samples_per_s, time_part(s));
}

namespace {
constexpr double kRedrawSeconds = 0.25;  // a bar's redraws: smooth enough, and cheap

// The bar in place of the terminal's current line (stdout, where the log goes too).
void draw(const std::string& line, bool newline) {
  std::fputs(fmt::format("\r{}\033[K{}", line, newline ? "\n" : "").c_str(), stdout);
  std::fflush(stdout);
}
}  // namespace

EpochProgress::EpochProgress(ProgressStyle style, double every_s, int64_t epoch, int64_t epochs,
                             int64_t steps, int world_size)
    : style_(style),
      every_s_(every_s),
      epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      world_size_(world_size) {}

ProgressState EpochProgress::state(int64_t step, int64_t samples, double loss) const {
  ProgressState s;
  s.epoch = epoch_;
  s.epochs = epochs_;
  s.step = step;
  s.steps = steps_;
  s.loss = loss;
  s.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
  s.timed_steps = first_step_ < 0 ? 0 : step - first_step_ + 1;
  s.samples_per_s = s.elapsed_s > 0 ? static_cast<double>(samples) * world_size_ / s.elapsed_s : 0;
  return s;
}

void EpochProgress::update(int64_t step, int64_t samples, const std::function<double()>& loss) {
  if (style_ == ProgressStyle::kOff) return;
  if (first_step_ < 0) first_step_ = step;
  last_step_ = step;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_shown_).count();
  if (since < (style_ == ProgressStyle::kBar ? kRedrawSeconds : every_s_)) return;
  last_shown_ = now;
  const ProgressState s = state(step, samples, loss());
  if (style_ == ProgressStyle::kBar) {
    draw(progress_bar(s), false);
  } else {
    log::info("{}", progress_line(s));
  }
}

void EpochProgress::finish(int64_t samples, const std::function<double()>& loss) {
  if (style_ != ProgressStyle::kBar || first_step_ < 0) return;
  draw(progress_bar(state(last_step_, samples, loss())), true);
}

}  // namespace ddp::train
