#include "ddp/train/timeline.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/host_collectives.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::train {
namespace {

using Json = nlohmann::ordered_json;  // ordered: the keys stay in the order they are set

// Microseconds to the nanosecond, the precision the trace has always been written with.
double to_nanoseconds(double us) {
  return std::round(us * 1e3) / 1e3;
}

// A metadata event ("process_name", ...) of process `pid`, lane `tid`.
Json metadata_event(const char* name, int pid, int tid, Json args) {
  Json e;
  e["name"] = name;
  e["ph"] = "M";
  e["pid"] = pid;
  e["tid"] = tid;
  e["args"] = std::move(args);
  return e;
}

std::string event_text(const Json& event) {
  return event.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// A span ("X") on its lane, from `begin_us` to `end_us`.
Json span_event(const Timeline::Event& e, int rank, double begin_us, double end_us) {
  Json event;
  event["name"] = e.name;
  event["cat"] = e.category;
  event["ph"] = "X";
  event["pid"] = rank;
  event["tid"] = e.lane;
  event["ts"] = to_nanoseconds(begin_us);
  event["dur"] = to_nanoseconds(std::max(0.0, end_us - begin_us));
  Json args = Json::object();
  if (e.step >= 0) args["step"] = e.step;
  if (e.bytes >= 0) args["bytes"] = e.bytes;
  event["args"] = std::move(args);
  return event;
}

// A counter ("C") or, without values, an instant ("i") at `at_us`, on the step's lane.
Json mark_event(const Timeline::Mark& m, int rank, double at_us) {
  Json event;
  event["name"] = m.name;
  event["ph"] = m.values.empty() ? "i" : "C";
  event["pid"] = rank;
  event["tid"] = Timeline::kStepLane;
  event["ts"] = to_nanoseconds(at_us);
  if (m.values.empty()) event["s"] = "p";  // an instant across the rank's lanes
  Json args = Json::object();
  for (const auto& [key, value] : m.values) args[key] = value;
  event["args"] = std::move(args);
  return event;
}

}  // namespace

Timeline::Timeline(size_t max_events)
    : max_events_(max_events), start_steady_(Clock::now()), start_wall_(comm::wall_time()) {
  events_.reserve(std::min<size_t>(max_events_, 65536));
}

bool Timeline::refuse() {
  if (events_.size() + marks_.size() < max_events_) return false;
  if (dropped_++ == 0)
    log::warn("timeline: {} events recorded, later ones are dropped", max_events_);
  return true;
}

void Timeline::add(const char* name, const char* category, int lane, Clock::time_point begin,
                   Clock::time_point end, int64_t step, int64_t bytes) {
  if (!refuse()) events_.push_back({name, category, lane, begin, end, step, bytes});
}

void Timeline::add_counter(std::string name, Clock::time_point at,
                           std::vector<std::pair<std::string, double>> values) {
  if (!refuse()) marks_.push_back({std::move(name), at, std::move(values)});
}

void Timeline::add_instant(std::string name, Clock::time_point at) {
  if (!refuse()) marks_.push_back({std::move(name), at, {}});
}

void Timeline::name_lane(int lane, std::string name) {
  lane_names_[lane] = std::move(name);
}

std::string Timeline::trace_events(int rank, double origin_wall) const {
  // Steady-clock times become wall-clock microseconds through the pair taken at construction.
  const double offset_us = (start_wall_ - origin_wall) * 1e6;
  const auto us = [&](Clock::time_point t) {
    return offset_us + std::chrono::duration<double, std::micro>(t - start_steady_).count();
  };
  // Metadata first: the process is the rank, lane 0 the step, the others the buckets. One event a
  // line, each dumped on its own: chrome_trace() joins the ranks' texts without parsing them.
  std::string out =
      event_text(metadata_event("process_name", rank, 0, {{"name", fmt::format("rank {}", rank)}}));
  out += ",\n" + event_text(metadata_event("process_sort_index", rank, 0, {{"sort_index", rank}}));
  int lanes = 0;
  for (const auto& e : events_) lanes = std::max(lanes, e.lane + 1);
  for (int lane = 0; lane < std::max(lanes, 1); ++lane) {
    const auto named = lane_names_.find(lane);
    const std::string name = named != lane_names_.end() ? named->second
                             : lane == kStepLane
                                 ? "training step"
                                 : fmt::format("bucket {} all-reduce", lane - kBucketLane);
    out += ",\n" + event_text(metadata_event("thread_name", rank, lane, {{"name", name}}));
  }
  for (const auto& e : events_) {
    out += ",\n";
    out += event_text(span_event(e, rank, us(e.begin), us(e.end)));
  }
  for (const auto& m : marks_) {
    out += ",\n";
    out += event_text(mark_event(m, rank, us(m.at)));
  }
  return out;
}

std::string chrome_trace(const std::vector<std::string>& rank_events) {
  // The ranks' events are joined as text, not parsed into one document: a long run has millions
  // of events, each about ten JSON values, which as nlohmann values take gigabytes.
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
