#pragma once
// bucket_cap_mb "auto": the first steps of training try bucket sizes and keep the fastest, as
// Horovod's autotuner did for its fusion buffer. Which sizes are worth trying depends on the model
// (sizes that cut its gradients into the same buckets are one candidate), the fastest on the
// network: few large buckets send fewer messages, small ones start sending sooner in backward.
//
// The schedule is a count of steps, the same on every rank, so every rank re-buckets at the same
// step; after the last trial the ranks agree on the slowest rank's time per candidate (one
// all-reduce) and keep the fastest.

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/core/bucketing.h"

namespace ddp::core {

// The sizes tried, in MiB: from a ladder of 0.5 to 100 MiB, one per distinct bucket layout of
// `tensors` visited in `order` (with `first_bucket_bytes` for the first bucket), ascending. Of
// sizes that give the same layout, 25 (PyTorch's default) stands for them where it is one,
// else the smallest. Always holds 25's layout.
std::vector<double> bucket_cap_candidates(const std::vector<TensorSlot>& tensors,
                                          size_t first_bucket_bytes,
                                          const std::vector<int64_t>& order);

// The size to keep: the fastest by `seconds` (per candidate), unless it beats the default's
// (25 MiB) time by less than `margin` (a fraction), when the default stays: a change must pay
// for itself beyond the noise of a few steps.
double fastest_bucket_cap(const std::vector<double>& caps_mb, const std::vector<double>& seconds,
                          double margin = 0.02);

// The trial schedule and its measurements.
//
//   BucketCapTuner tuner(candidates);
//   model->set_bucket_cap_mb(tuner.cap_mb());
//   each step: ...train...; if (tuner.record(step_seconds)) {
//     if (tuner.done()) model->set_bucket_cap_mb(tuner.agree(group, device));
//     else model->set_bucket_cap_mb(tuner.cap_mb());
//   }
class BucketCapTuner {
 public:
  // Each candidate is tried `rounds` times (the second round in reverse order, so that a trend
  // in step times does not favour the first); a trial is `warmup` steps not timed (the first
  // after a re-bucketing allocates) and `timed` steps.
  explicit BucketCapTuner(std::vector<double> caps_mb, int rounds = 2, int warmup = 1,
                          int timed = 3);

  double cap_mb() const;  // the size the current step trains with
  bool done() const { return trial_ == order_.size(); }
  // Records a step's seconds; true when the size changes for the next step (or tuning ended).
  bool record(double seconds);
  // After done(): each candidate's median, the slowest rank's (an all-reduce max on `group`, a
  // collective, of a tensor on `device`: the group's), and the size kept. On every rank alike.
  double agree(comm::ProcessGroup& group, c10::Device device);

  const std::vector<double>& caps_mb() const { return caps_; }
  const std::vector<double>& agreed_seconds() const { return agreed_; }
  int64_t steps() const { return static_cast<int64_t>(order_.size()) * (warmup_ + timed_); }

 private:
  std::vector<double> caps_;
  std::vector<size_t> order_;                 // candidate of each trial
  std::vector<std::vector<double>> samples_;  // per candidate, the timed steps' seconds
  std::vector<double> agreed_;
  int warmup_;
  int timed_;
  size_t trial_ = 0;
  int step_in_trial_ = 0;
};

}  // namespace ddp::core
