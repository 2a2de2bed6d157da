#include "ddp/comm/flight_recorder.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>

namespace ddp::comm {
namespace {

std::atomic<uint64_t> g_dump_requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "incremented in a signal handler");

// A JSON string literal of `s` (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
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

std::string FlightRecorder::to_json(int rank, int world_size, const std::string& backend,
                                    const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out = fmt::format(
      "{{\"rank\": {}, \"world_size\": {}, \"backend\": {}, \"reason\": {}, \"time\": {:.3f}, "
      "\"phase\": {}, \"last_issued\": {}, \"collectives\": [",
      rank, world_size, json_string(backend), json_string(reason), wall_time(), json_string(phase_),
      last_issued_);
  bool first = true;
  for (const auto& r : records_) {
    out += fmt::format(
        "{}\n  {{\"seq\": {}, \"op\": {}, \"phase\": {}, \"bytes\": {}, \"start\": {:.3f}, "
        "\"end\": {:.3f}, \"state\": \"{}\"}}",
        first ? "" : ",", r.seq, json_string(r.op), json_string(r.phase), r.bytes, r.start, r.end,
        to_string(r.state));
    first = false;
  }
  return out + "]}\n";
}

void request_flight_dump_from_signal() {
  g_dump_requests.fetch_add(1, std::memory_order_relaxed);
}

uint64_t flight_dump_requests() {
  return g_dump_requests.load(std::memory_order_relaxed);
}

}  // namespace ddp::comm
