#include "ddp/core/bucket_tuning.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "ddp/common/error.h"

namespace ddp::core {

namespace {

constexpr double kDefaultCapMb = 25.0;
constexpr double kLadderMb[] = {0.5, 1, 2, 5, 10, 25, 50, 100};

double median(std::vector<double> values) {
  DDP_CHECK(!values.empty(), "a median of no values");
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

}  // namespace

std::vector<double> bucket_cap_candidates(const std::vector<TensorSlot>& tensors,
                                          size_t first_bucket_bytes,
                                          const std::vector<int64_t>& order) {
  std::vector<double> caps;
  std::vector<std::vector<std::vector<size_t>>> layouts;
  for (double mb : kLadderMb) {
    auto layout = assign_buckets(tensors, {first_bucket_bytes, mib_to_bytes(mb)}, order).buckets;
    const auto same = std::find(layouts.begin(), layouts.end(), layout);
    if (same == layouts.end()) {
      caps.push_back(mb);
      layouts.push_back(std::move(layout));
    } else if (mb == kDefaultCapMb) {
      caps[static_cast<size_t>(same - layouts.begin())] = mb;  // the default speaks for them
    }
  }
  return caps;  // the ladder ascends and a replaced size is within its run: still ascending
}

double fastest_bucket_cap(const std::vector<double>& caps_mb, const std::vector<double>& seconds,
                          double margin) {
  DDP_CHECK(!caps_mb.empty() && caps_mb.size() == seconds.size(), "one time per candidate");
  const size_t best =
      static_cast<size_t>(std::min_element(seconds.begin(), seconds.end()) - seconds.begin());
  const auto fallback = std::find(caps_mb.begin(), caps_mb.end(), kDefaultCapMb);
  if (fallback != caps_mb.end()) {
    const double default_seconds = seconds[static_cast<size_t>(fallback - caps_mb.begin())];
    if (seconds[best] > default_seconds * (1.0 - margin)) return kDefaultCapMb;
  }
  return caps_mb[best];
}

BucketCapTuner::BucketCapTuner(std::vector<double> caps_mb, int rounds, int warmup, int timed)
    : caps_(std::move(caps_mb)), samples_(caps_.size()), warmup_(warmup), timed_(timed) {
  DDP_CHECK(!caps_.empty() && rounds >= 1 && warmup >= 0 && timed >= 1, "a tuning schedule");
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < caps_.size(); ++i) {
      order_.push_back(round % 2 == 0 ? i : caps_.size() - 1 - i);
    }
  }
}

double BucketCapTuner::cap_mb() const {
  DDP_CHECK(!done(), "the tuning is over: agree() says the size kept");
  return caps_[order_[trial_]];
}

bool BucketCapTuner::record(double seconds) {
  DDP_CHECK(!done(), "a step recorded after the tuning");
  if (step_in_trial_ >= warmup_) samples_[order_[trial_]].push_back(seconds);
  if (++step_in_trial_ < warmup_ + timed_) return false;
  step_in_trial_ = 0;
  const size_t previous = order_[trial_++];
  return done() || order_[trial_] != previous;
}

double BucketCapTuner::agree(comm::ProcessGroup& group, c10::Device device) {
  DDP_CHECK(done(), "agree() after the last trial");
  std::vector<double> medians;
  for (const auto& s : samples_) medians.push_back(median(s));
  auto slowest = at::tensor(medians, at::kDouble).to(device);
  group.all_reduce(slowest, comm::ReduceOp::kMax)->wait();
  slowest = slowest.cpu();
  agreed_.assign(slowest.data_ptr<double>(), slowest.data_ptr<double>() + slowest.numel());
  return fastest_bucket_cap(caps_, agreed_);
}

}  // namespace ddp::core
