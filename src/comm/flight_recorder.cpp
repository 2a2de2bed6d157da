#include "ddp/comm/flight_recorder.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>

namespace ddp::comm {
namespace {

std::atomic<uint64_t> g_dump_requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "incremented in a signal handler");

using Json = nlohmann::ordered_json;  // ordered: the keys stay in the order they are set

// Seconds to the millisecond, the precision the records have always been written with.
double to_milliseconds(double seconds) {
  return std::round(seconds * 1e3) / 1e3;
}

Json record_json(const CollectiveRecord& r) {
  Json c;
  c["seq"] = r.seq;
  c["op"] = r.op;
  c["phase"] = r.phase;
  c["bytes"] = r.bytes;
  c["start"] = to_milliseconds(r.start);
  c["end"] = to_milliseconds(r.end);
  c["state"] = to_string(r.state);
  return c;
}

}  // namespace

const char* to_string(CollectiveState state) {
  switch (state) {
    case CollectiveState::kIssued:
      return "issued";
    case CollectiveState::kDone:
      return "done";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "?";
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {}

void FlightRecorder::set_phase(std::string phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = std::move(phase);
}

std::string FlightRecorder::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return phase_;
}

void FlightRecorder::issued(uint64_t seq, std::string op, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord r;
  r.seq = seq;
  r.op = std::move(op);
  r.phase = phase_;
  r.bytes = bytes;
  r.start = wall_time();
  records_.push_back(std::move(r));
  if (records_.size() > capacity_) records_.pop_front();
  last_issued_ = seq;
}

void FlightRecorder::finished(uint64_t seq, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Usually the newest or close to it: search from the back.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->seq == seq) {
      it->end = wall_time();
      it->state = ok ? CollectiveState::kDone : CollectiveState::kFailed;
      return;
    }
  }
}

void FlightRecorder::arrived(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    if (it->seq == seq) {
      it->arrived = wall_time();
      return;
    }
  }
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {records_.begin(), records_.end()};
}

std::optional<CollectiveRecord> FlightRecorder::oldest_pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : records_) {
    if (r.state == CollectiveState::kIssued) return r;
  }
  return std::nullopt;
}

uint64_t FlightRecorder::last_issued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_issued_;
}

void FlightRecorder::set_straggler(std::string verdict) {
  std::lock_guard<std::mutex> lock(mutex_);
  straggler_ = std::move(verdict);
}

std::string FlightRecorder::straggler() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return straggler_;
}

std::string FlightRecorder::to_json(int rank, int world_size, const std::string& backend,
                                    const std::string& reason,
                                    const std::optional<WaitingIn>& waiting_in) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Json record;
  record["rank"] = rank;
  record["world_size"] = world_size;
  record["backend"] = backend;
  record["reason"] = reason;
  record["time"] = to_milliseconds(wall_time());
  record["phase"] = phase_;
  record["last_issued"] = last_issued_;
  Json collectives = Json::array();
  for (const auto& r : records_) collectives.push_back(record_json(r));
  record["collectives"] = std::move(collectives);
  if (waiting_in) {
    record["waiting_in"] = {{"function", waiting_in->function},
                            {"file", waiting_in->file},
                            {"line", waiting_in->line},
                            {"stacks_file", waiting_in->stacks_file}};
  }
  if (!straggler_.empty()) record["straggler"] = straggler_;
  // Indented, one field a line, for a reader with `less`. An error message or an op name may hold
  // bytes that are not UTF-8 (JSON must be): those become U+FFFD rather than an exception that
  // would lose the whole record.
  return record.dump(2, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace) + "\n";
}

void request_flight_dump_from_signal() {
  g_dump_requests.fetch_add(1, std::memory_order_relaxed);
}

uint64_t flight_dump_requests() {
  return g_dump_requests.load(std::memory_order_relaxed);
}

}  // namespace ddp::comm
