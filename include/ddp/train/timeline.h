#pragma once
// The timeline of a run (--timeline PATH): what each rank did when, as a Chrome trace
// (chrome://tracing, https://ui.perfetto.dev). One process per rank; lane 0 holds the training
// step's phases (data wait, forward, backward with the reducer's finalize inside it, optimizer
// step) and the epoch's evaluation and checkpoint; lane 1 + b holds bucket b's all-reduces, so
// that communication running under backward shows as overlapping bars. Each rank's "step ms"
// counter graphs its straggler-attribution window (data, compute, comm, optimizer in ms a step),
// and rank 0 marks where it named a straggler, or its recovery (train/straggler.h).
//
// Times are taken on the steady clock and written as microseconds since the earliest start of
// any rank on the wall clock, so the ranks line up (across hosts as well as their clocks agree).
// On CUDA the spans are host times: kernels run asynchronously, a span ends when the host moved
// on (a bucket's all-reduce when its CUDA event was seen complete).
//
// Not thread-safe: the training thread records (backward's hooks report through the reducer's
// IterationStats, read afterwards on the same thread).

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp::comm {
class ProcessGroup;
}

namespace ddp::train {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kStepLane = 0;
  // Bucket b's all-reduces are on lane kBucketLane + b.
  static constexpr int kBucketLane = 1;

  struct Event {
    const char* name;      // a string literal: "forward", "all-reduce", ...
    const char* category;  // "compute", "comm", "data", "io"
    int lane;
    Clock::time_point begin, end;
    int64_t step;   // the optimizer step it belongs to; -1: none
    int64_t bytes;  // all-reduces: the bucket's bytes on the wire; -1: none
  };

  // What is seen at one time rather than over a span: a counter's values (Chrome's "C" event,
  // drawn as a graph of the rank: the straggler attribution's ms a step), or, without values, an
  // instant on lane 0 ("i": a straggler named, with its log line).
  struct Mark {
    std::string name;
    Clock::time_point at;
    std::vector<std::pair<std::string, double>> values;  // empty: an instant
  };

  // Keeps at most `max_events` events (about 64 bytes each) and marks; later ones are dropped and
  // counted.
  explicit Timeline(size_t max_events = 4'000'000);

  void add(const char* name, const char* category, int lane, Clock::time_point begin,
           Clock::time_point end, int64_t step = -1, int64_t bytes = -1);
  void add_counter(std::string name, Clock::time_point at,
                   std::vector<std::pair<std::string, double>> values);
  void add_instant(std::string name, Clock::time_point at);
  // The name shown for `lane` (default: "training step" for lane 0, "bucket b all-reduce" for the
  // others; --fsdp's lanes are its units').
  void name_lane(int lane, std::string name);
  const std::vector<Event>& events() const { return events_; }
  const std::vector<Mark>& marks() const { return marks_; }
  size_t dropped() const { return dropped_; }
  // The wall-clock time (seconds since the Unix epoch) of this timeline's creation.
  double start_wall() const { return start_wall_; }

  // This rank's events as Chrome trace events, comma-separated (a JSON array's inside, without
  // the brackets), with the process and lane names; times in microseconds since `origin_wall`
  // (seconds since the Unix epoch). A pure function of the events.
  std::string trace_events(int rank, double origin_wall) const;

  // Records a span of lane 0 from construction to destruction.
  class Scope {
   public:
    Scope(Timeline* timeline, const char* name, const char* category, int64_t step = -1)
        : timeline_(timeline),
          name_(name),
          category_(category),
          step_(step),
          begin_(timeline != nullptr ? Clock::now() : Clock::time_point()) {}
    ~Scope() {
      if (timeline_ != nullptr)
        timeline_->add(name_, category_, kStepLane, begin_, Clock::now(), step_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;  // nullptr: record nothing (no --timeline)
    const char* name_;
    const char* category_;
    int64_t step_;
    Clock::time_point begin_;
  };

 private:
  bool refuse();  // true once the limit is reached; counts the drop
  size_t max_events_;
  size_t dropped_ = 0;
  std::vector<Event> events_;
  std::vector<Mark> marks_;
  std::map<int, std::string> lane_names_;
  Clock::time_point start_steady_;
  double start_wall_;
};

// A whole Chrome trace file from the ranks' trace_events(), in rank order.
std::string chrome_trace(const std::vector<std::string>& rank_events);

// Gathers every rank's timeline to rank 0, which writes it to `path` atomically. A collective
// (on `device`, the group's); throws Error when the file cannot be written.
void write_timeline(comm::ProcessGroup& group, const c10::Device& device, const Timeline& timeline,
                    const std::string& path);

}  // namespace ddp::train
