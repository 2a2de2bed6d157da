#pragma once
// The flight recorder: every process group keeps its last collectives (sequence number, op, the
// phase of the training step it was issued in, bytes, start and end time, state) in a ring
// buffer, so that a hang can be explained after the fact: which rank did not enter which
// collective, and where in the step it was. Written as JSON to <output>/debug/rank<r>.json on a
// collective failure or timeout and on SIGUSR1; `ddp_train --diagnose DIR` merges the files.
//
// Thread-safe: collectives may be issued from autograd threads (DDP's hooks) while the watchdog
// thread reads the buffer. Free of LibTorch (library ddp::flight_records), so the launcher can read
// and merge the records too (comm/diagnostics/diagnose.h).

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddp::comm {

enum class CollectiveState { kIssued, kDone, kFailed };
const char* to_string(CollectiveState state);

struct CollectiveRecord {
  uint64_t seq = 0;
  std::string op;     // "all_reduce(sum)", ...
  std::string phase;  // "forward", "backward: bucket 2", "evaluation", ...
  int64_t bytes = 0;
  double start = 0.0;  // seconds since the Unix epoch (comparable across hosts)
  double end = 0.0;    // 0 while issued (set when waited for)
  // When the backend's communication thread completed it, where the backend reports that (gloo);
  // 0 otherwise. Between start and arrived the collective was in flight.
  double arrived = 0.0;
  CollectiveState state = CollectiveState::kIssued;
};

// Where a rank's main thread was when its record was written: the innermost frame of the
// program's own code (ddp/comm/diagnostics/stacks.h), and the file beside the record with every
// thread's stack.
struct WaitingIn {
  std::string function;
  std::string file;  // "" without debug info
  int line = 0;
  std::string stacks_file;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 256);

  // The phase that the next collectives are issued in.
  void set_phase(std::string phase);
  std::string phase() const;

  void issued(uint64_t seq, std::string op, int64_t bytes);
  void finished(uint64_t seq, bool ok);
  // The backend's thread completed `seq` (any thread may call it).
  void arrived(uint64_t seq);

  // Oldest first; at most `capacity` records.
  std::vector<CollectiveRecord> records() const;
  // The oldest collective still issued (waited on), if any.
  std::optional<CollectiveRecord> oldest_pending() const;
  uint64_t last_issued() const;
  // The straggler attribution's verdict on the last window of steps ("straggler: rank 1 computes
  // ...", train/straggler.h; "" for none), which the record keeps: the hang doctor says which
  // rank was slowing before a stall.
  void set_straggler(std::string verdict);
  std::string straggler() const;

  // {"rank": r, "world_size": n, "backend": b, "reason": why, "time": now, "phase": current,
  //  "last_issued": seq, "collectives": [{"seq", "op", "phase", "bytes", "start", "end",
  //  "state"}, ...], "waiting_in": {"function", "file", "line", "stacks_file"},
  //  "straggler": verdict}, indented, "waiting_in" only where it is given and "straggler" only
  //  where one was named; times to the millisecond. Strings are UTF-8: bytes
  //  that are not (an error message may hold any) become U+FFFD.
  std::string to_json(int rank, int world_size, const std::string& backend,
                      const std::string& reason,
                      const std::optional<WaitingIn>& waiting_in = std::nullopt) const;

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::string phase_ = "setup";
  std::string straggler_;
  uint64_t last_issued_ = 0;
  std::deque<CollectiveRecord> records_;
};

// Seconds since the Unix epoch.
double wall_time();

// SIGUSR1's request that every process group of this process write its flight record: only an
// atomic increment, so it is async-signal-safe. The watchdog threads act on it.
void request_flight_dump_from_signal();
// How many requests there have been; a watchdog writes when the count moved since it last looked.
uint64_t flight_dump_requests();

}  // namespace ddp::comm
