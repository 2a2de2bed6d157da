#include "ddp/train/straggler.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace ddp::train {

StepTimes& StepTimes::operator+=(const StepTimes& o) {
  data_s += o.data_s;
  compute_s += o.compute_s;
  comm_s += o.comm_s;
  optimizer_s += o.optimizer_s;
  return *this;
}

std::vector<double> to_doubles(const StepTimes& t) {
  return {t.data_s, t.compute_s, t.comm_s, t.optimizer_s};
}

StepTimes step_times_from(const double* values) {
  StepTimes t;
  t.data_s = values[0];
  t.compute_s = values[1];
  t.comm_s = values[2];
  t.optimizer_s = values[3];
  return t;
}

const char* cause_name(StragglerCause cause) {
  switch (cause) {
    case StragglerCause::kComputation:
      return "computation";
    case StragglerCause::kDataLoading:
      return "data loading";
    case StragglerCause::kCommunication:
      return "communication";
  }
  return "?";
}

namespace {

using Figure = std::function<double(const StepTimes&)>;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2.0;
}

// The median of `figure` over every rank but `rank`.
double others_median(const std::vector<StepTimes>& ranks, size_t rank, const Figure& figure) {
  std::vector<double> others;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (r != rank) others.push_back(figure(ranks[r]));
  }
  return median(std::move(others));
}

double compute_of(const StepTimes& t) {
  return t.compute_s + t.optimizer_s;
}
double data_of(const StepTimes& t) {
  return t.data_s;
}
double comm_of(const StepTimes& t) {
  return t.comm_s;
}

// The rank whose `figure` stands out most, when it passes the threshold and the excess floor.
std::optional<StragglerVerdict> worst(const std::vector<StepTimes>& ranks, int64_t steps,
                                      double threshold, const Figure& figure,
                                      StragglerCause cause) {
  std::optional<StragglerVerdict> found;
  const double per_step_ms = 1000.0 / static_cast<double>(steps);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const double mine = figure(ranks[r]) * per_step_ms;
    const double others = others_median(ranks, r, figure) * per_step_ms;
    if (mine - others < kStragglerMinExcessMs) continue;
    // The others' median may be about 0 (no data wait elsewhere): a hundredth of a millisecond
    // then, so that the ratio stays a number.
    const double ratio = mine / std::max(others, 0.01);
    if (ratio < threshold || (found && ratio <= found->ratio)) continue;
    found = StragglerVerdict{static_cast<int>(r), cause, ratio, mine, others};
  }
  return found;
}

}  // namespace

std::optional<StragglerVerdict> find_straggler(const std::vector<StepTimes>& ranks, int64_t steps,
                                               double threshold) {
  if (threshold <= 0.0 || steps <= 0 || ranks.size() < 2) return std::nullopt;
  auto compute = worst(ranks, steps, threshold, compute_of, StragglerCause::kComputation);
  auto data = worst(ranks, steps, threshold, data_of, StragglerCause::kDataLoading);
  if (compute && data) return data->ratio > compute->ratio ? data : compute;
  if (compute || data) return compute ? compute : data;
  // Blocked time varies most where ranks are even: a rank's is a straggler's only when it is a
  // tenth of the step above the others', and the rank was not merely faster at its own work
  // (the fast wait longest).
  auto comm = worst(ranks, steps, threshold, comm_of, StragglerCause::kCommunication);
  if (!comm) return std::nullopt;
  const auto r = static_cast<size_t>(comm->rank);
  const auto busy = [](const StepTimes& t) { return t.busy_s(); };
  const auto step = [](const StepTimes& t) { return t.busy_s() + t.comm_s; };
  const double per_step_ms = 1000.0 / static_cast<double>(steps);
  const bool tenth =
      comm->rank_ms - comm->median_ms >= 0.1 * others_median(ranks, r, step) * per_step_ms;
  const bool not_faster = ranks[r].busy_s() >= 0.9 * others_median(ranks, r, busy);
  return tenth && not_faster ? comm : std::nullopt;
}

std::string straggler_message(const StragglerVerdict& v, int64_t first, int64_t last) {
  const char* what = "";
  const char* figure = "";
  const char* others = "";
  switch (v.cause) {
    case StragglerCause::kComputation:
      what = "computes {:.1f}x slower than";
      figure = "forward+backward+optimizer";
      others = "data and network normal";
      break;
    case StragglerCause::kDataLoading:
      what = "waits {:.1f}x longer for data than";
      figure = "data";
      others = "computation and network normal";
      break;
    case StragglerCause::kCommunication:
      what = "is blocked in collectives {:.1f}x longer than";
      figure = "collectives";
      others = "computation and data normal";
      break;
  }
  return fmt::format(
      "straggler: rank {} {} the median of the other ranks over steps {}-{} ({} {:.1f} ms vs "
      "{:.1f} ms a step); {}",
      v.rank, fmt::format(fmt::runtime(what), v.ratio), first, last, figure, v.rank_ms, v.median_ms,
      others);
}

std::string recovered_message(int rank, const std::vector<StepTimes>& ranks, int64_t steps,
                              int64_t first, int64_t last) {
  const double per_step_ms = 1000.0 / static_cast<double>(std::max<int64_t>(steps, 1));
  const auto busy = [](const StepTimes& t) { return t.busy_s(); };
  const size_t r = static_cast<size_t>(rank);
  const double mine = r < ranks.size() ? ranks[r].busy_s() * per_step_ms : 0.0;
  return fmt::format(
      "straggler: rank {} recovered over steps {}-{} (busy {:.1f} ms a step, the others' median "
      "{:.1f} ms)",
      rank, first, last, mine, others_median(ranks, r, busy) * per_step_ms);
}

std::vector<std::string> straggler_table(const std::vector<StepTimes>& ranks, int64_t steps) {
  std::vector<std::string> lines = {
      "rank   data ms  compute ms   comm ms  optimizer ms  busy/others' median"};
  const double per_step_ms = 1000.0 / static_cast<double>(std::max<int64_t>(steps, 1));
  const auto busy = [](const StepTimes& t) { return t.busy_s(); };
  for (size_t r = 0; r < ranks.size(); ++r) {
    const StepTimes& t = ranks[r];
    const double others = others_median(ranks, r, busy);
    lines.push_back(fmt::format("{:4} {:9.2f} {:11.2f} {:9.2f} {:13.2f}  {}", r,
                                t.data_s * per_step_ms, t.compute_s * per_step_ms,
                                t.comm_s * per_step_ms, t.optimizer_s * per_step_ms,
                                others > 0.0 ? fmt::format("{:.2f}", t.busy_s() / others) : "-"));
  }
  return lines;
}

namespace {

// `into` += `window`, afresh when the world size changed.
void add_sums(std::vector<StepTimes>& into, int64_t& steps, const std::vector<StepTimes>& window,
              int64_t window_steps) {
  if (into.size() != window.size()) {
    into.assign(window.size(), StepTimes{});
    steps = 0;
  }
  for (size_t r = 0; r < window.size(); ++r) into[r] += window[r];
  steps += window_steps;
}

}  // namespace

StragglerRecord::Lines StragglerRecord::add_window(const std::vector<StepTimes>& ranks,
                                                   int64_t steps, int64_t last_step) {
  add_sums(run_, run_steps_, ranks, steps);
  add_sums(epoch_, epoch_steps_, ranks, steps);
  const int64_t first = last_step - steps + 1;
  Lines lines;
  const auto verdict = find_straggler(ranks, steps, threshold_);
  if (verdict) epoch_straggler_ = verdict;
  const bool same =
      verdict && named_ && verdict->rank == named_->rank && verdict->cause == named_->cause;
  if (named_ && !same && (!verdict || verdict->rank != named_->rank)) {
    lines.info = recovered_message(named_->rank, ranks, steps, first, last_step);
  }
  if (verdict && !same) lines.warning = straggler_message(*verdict, first, last_step);
  named_ = verdict;
  return lines;
}

void StragglerRecord::begin_epoch() {
  epoch_.clear();
  epoch_steps_ = 0;
  epoch_straggler_.reset();
}

}  // namespace ddp::train
