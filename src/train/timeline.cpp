#include "ddp/train/timeline.h"

#include <fmt/format.h>

#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::train {

Timeline::Timeline(size_t max_events)
    : max_events_(max_events), start_steady_(Clock::now()), start_wall_(comm::wall_time()) {
  events_.reserve(std::min<size_t>(max_events_, 65536));
}

void Timeline::add(const char* name, const char* category, int lane, Clock::time_point begin,
                   Clock::time_point end, int64_t step, int64_t bytes) {
  if (events_.size() >= max_events_) {
    if (dropped_++ == 0) {
      log::warn("timeline: {} events recorded, later ones are dropped", max_events_);
    }
    return;
  }
  events_.push_back({name, category, lane, begin, end, step, bytes});
}

std::string Timeline::trace_events(int rank, double origin_wall) const {
  // Steady-clock times become wall-clock microseconds through the pair taken at construction.
  const double offset_us = (start_wall_ - origin_wall) * 1e6;
  const auto us = [&](Clock::time_point t) {
    return offset_us + std::chrono::duration<double, std::micro>(t - start_steady_).count();
  };
  // Metadata first: the process is the rank, lane 0 the step, the others the buckets.
  std::string out = fmt::format(
      "{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {0}, \"tid\": 0, \"args\": "
      "{{\"name\": \"rank {0}\"}}}},\n{{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": "
      "{0}, \"tid\": 0, \"args\": {{\"sort_index\": {0}}}}}",
      rank);
  int lanes = 0;
  for (const auto& e : events_) lanes = std::max(lanes, e.lane + 1);
  for (int lane = 0; lane < std::max(lanes, 1); ++lane) {
    const std::string name = lane == kStepLane
                                 ? "training step"
                                 : fmt::format("bucket {} all-reduce", lane - kBucketLane);
    out += fmt::format(
        ",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"args\": "
        "{{\"name\": \"{}\"}}}}",
        rank, lane, name);
  }
  for (const auto& e : events_) {
    std::string args;
    if (e.step >= 0) args += fmt::format("\"step\": {}", e.step);
    if (e.bytes >= 0) args += fmt::format("{}\"bytes\": {}", args.empty() ? "" : ", ", e.bytes);
    const double begin = us(e.begin);
    out += fmt::format(
        ",\n{{\"name\": \"{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, "
        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{{}}}}}",
        e.name, e.category, rank, e.lane, begin, std::max(0.0, us(e.end) - begin), args);
  }
  return out;
}

std::string chrome_trace(const std::vector<std::string>& rank_events) {
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t r = 0; r < rank_events.size(); ++r) {
    if (r > 0) out += ",\n";
    out += rank_events[r];
  }
  return out + "\n]}\n";
}

void write_timeline(comm::ProcessGroup& group, const c10::Device& device, const Timeline& timeline,
                    const std::string& path) {
  group.set_phase("timeline");
  // Time zero: the earliest start of any rank.
  const double origin =
      comm::all_reduce_scalar(group, timeline.start_wall(), comm::ReduceOp::kMin, device);
  const std::string mine = timeline.trace_events(group.rank(), origin);
  // Every rank's text to rank 0 (gathered everywhere: there is no gather to one rank).
  const auto ranks = comm::all_gather_bytes(group, mine, device);
  if (group.rank() != 0) return;

  write_file_atomically(path, chrome_trace(ranks));
  log::info("timeline: {} events of rank 0 ({} ranks) written to {}", timeline.events().size(),
            group.world_size(), path);
}

}  // namespace ddp::train
