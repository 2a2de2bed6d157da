#pragma once
// The watchdog of a process group, a class of its own as Horovod keeps its stall inspector
// (horovod/common/stall_inspector.h) apart from its controller: one thread per group that
// publishes this rank's progress, warns once about each collective waited on too long, and writes
// the flight record when SIGUSR1 asked (request_flight_dump_from_signal). Beside each record it
// writes every thread's stack (ddp/comm/diagnostics/stacks.h), rank<r>.stacks.txt; for a collective
// that times out, the stacks of the moment just before, while the thread still waits in it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ddp/comm/flight_recorder.h"
#include "ddp/comm/process_group.h"

namespace ddp::comm {

struct WatchdogOptions {
  // A collective waited on longer than this gets one warning naming the ranks that have not
  // entered it (where the backend can tell); 0: no warning.
  std::chrono::milliseconds stall_warning = std::chrono::seconds(60);
  std::string dump_path;  // where dump_flight_record() and SIGUSR1 write; "": nowhere
  // A second copy for the launcher, which merges the ranks' records (DDP_FLIGHT_DIR); "": none.
  std::string launcher_copy;
  // How often ranks publish how far they are (for the stall warning's list of laggards).
  std::chrono::milliseconds progress_interval = std::chrono::milliseconds(500);
};

class Watchdog {
 public:
  // Starts the thread at once. The watchdog shares ownership of `group`, so the group outlives
  // it; the group's collectives keep running on their own threads meanwhile. SIGUSR1 requests
  // made before the construction are not acted on.
  Watchdog(std::shared_ptr<ProcessGroup> group, WatchdogOptions options);
  ~Watchdog();  // stops and joins the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Writes the flight record to options.dump_path and launcher_copy (atomically) with `reason`,
  // and beside each the threads' stacks; returns the first record's path, or "" when none was
  // written (failures logged; never throws). Callable from any thread.
  std::string dump_flight_record(const std::string& reason);

 private:
  void watch();  // the thread's loop
  void publish_progress();
  void check_stall();

  // Every thread's stack, as written beside a record.
  struct Stacks {
    uint64_t seq = 0;                     // the collective waited on when they were taken
    std::string text;                     // stacks::format's, after a header line
    std::optional<WaitingIn> waiting_in;  // the main thread's own frame; stacks_file unset
  };
  Stacks take_stacks(uint64_t seq, const std::string& why) const;
  void keep_stacks_before_timeout();
  Stacks stacks_for_record(const std::string& reason);

  std::shared_ptr<ProcessGroup> group_;
  WatchdogOptions options_;
  std::string backend_;  // group_->backend_name(), read once
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  uint64_t warned_seq_ = 0;          // the last collective the stall warning named
  uint64_t published_seq_ = 0;       // the last progress published
  uint64_t dump_requests_seen_ = 0;  // flight_dump_requests() when the thread last looked
  // Timed: a record written while stacks are being kept waits for them, but not forever (the
  // terminate handler may run on the very thread that holds it).
  std::timed_mutex stacks_mutex_;
  std::optional<Stacks> kept_stacks_;  // taken just before collective kept_stacks_->seq timed out
  std::thread thread_;                 // last: started once everything above is set
};

}  // namespace ddp::comm
