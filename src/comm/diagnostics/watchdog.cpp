#include "ddp/comm/diagnostics/watchdog.h"

#include <unistd.h>
#include <algorithm>
#include <exception>
#include <filesystem>
#include <mutex>
#include <vector>

#include "ddp/comm/diagnostics/stacks.h"
#include "ddp/comm/flight_recorder.h"
#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::comm {
namespace {

// The live watchdogs, for the terminate handler.
std::mutex g_live_mutex;
std::vector<Watchdog*> g_live;
std::terminate_handler g_previous_terminate = nullptr;

// The text of the exception being handled, if any.
std::string pending_exception() {
  const auto pending = std::current_exception();
  if (!pending) return "no exception";
  try {
    std::rethrow_exception(pending);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

// An exception no thread caught (one in a library's own thread: gloo's transport throws
// gloo::EnforceNotMet there when the ranks' messages do not match) ends the process with abort;
// first, every live watchdog writes its flight record with the exception as the reason, so that
// the hang doctor can still read what this rank had issued. Best effort: it takes the recorders'
// locks, which the dying thread does not hold (none of ours throws while holding one).
[[noreturn]] void write_records_then_terminate() {
  const std::string reason = "terminate: " + pending_exception();
  {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    for (Watchdog* watchdog : g_live) watchdog->dump_flight_record(reason);
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

void register_live(Watchdog* watchdog) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  if (g_live.empty() && g_previous_terminate == nullptr) {
    g_previous_terminate = std::set_terminate(write_records_then_terminate);
  }
  g_live.push_back(watchdog);
}

void unregister_live(Watchdog* watchdog) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  g_live.erase(std::remove(g_live.begin(), g_live.end(), watchdog), g_live.end());
}

}  // namespace

Watchdog::Watchdog(std::shared_ptr<ProcessGroup> group, WatchdogOptions options)
    : group_(std::move(group)),
      options_(std::move(options)),
      backend_(group_->backend_name()),
      dump_requests_seen_(flight_dump_requests()) {  // requests before it started are not its own
  register_live(this);
  thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  unregister_live(this);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, options_.progress_interval, [this] { return stop_; })) {
    lock.unlock();
    if (const uint64_t requests = flight_dump_requests(); requests != dump_requests_seen_) {
      dump_requests_seen_ = requests;
      const auto path = dump_flight_record("SIGUSR1");
      if (!path.empty()) log::warn("rank {}: flight record written to {}", group_->rank(), path);
    }
    publish_progress();
    check_stall();
    keep_stacks_before_timeout();
    lock.lock();
  }
}

void Watchdog::publish_progress() {
  const auto& board = group_->progress_board();
  const uint64_t seq = group_->recorder().last_issued();
  if (!board || seq == published_seq_) return;
  try {
    board->publish(group_->rank(), seq);
    published_seq_ = seq;
  } catch (const std::exception& e) {  // the store may be gone at the end of a failed run
    log::debug("rank {}: could not publish progress: {}", group_->rank(), e.what());
  }
}

void Watchdog::check_stall() {
  const auto limit = std::chrono::duration<double>(options_.stall_warning).count();
  if (limit <= 0) return;
  const auto pending = group_->recorder().oldest_pending();
  if (!pending || pending->seq == warned_seq_) return;
  const double waited = wall_time() - pending->start;
  if (waited < limit) return;
  warned_seq_ = pending->seq;
  std::vector<uint64_t> progress;
  try {
    if (const auto& board = group_->progress_board()) progress = board->read(group_->world_size());
  } catch (const std::exception& e) {
    log::debug("rank {}: could not read the other ranks' progress: {}", group_->rank(), e.what());
  }
  const std::string slowing = group_->recorder().straggler();
  log::warn("{}{}", stall_message(group_->rank(), *pending, waited, progress),
            slowing.empty() ? "" : "; before it, " + slowing);
}

Watchdog::Stacks Watchdog::take_stacks(uint64_t seq, const std::string& why) const {
  Stacks taken;
  taken.seq = seq;
  const auto threads = stacks::capture();
  if (threads.empty()) return taken;  // a build without stack traces
  taken.text = fmt::format("rank {} (pid {}) at {:.3f} s since the epoch: {}\n\n{}", group_->rank(),
                           ::getpid(), wall_time(), why, stacks::format(threads));
  if (const auto frame = stacks::innermost_own_frame(threads.front(), stacks::executable_path())) {
    taken.waiting_in = WaitingIn{frame->function, frame->file, frame->line, ""};
  }
  return taken;
}

// Note [Stacks are taken before the timeout]: by the time a collective's timeout has reached the
// code that writes the record (the trainer's catch), the waiting thread's stack has unwound; so
// the stacks are taken a little before the timeout, while it still waits (two watchdog rounds
// before, as the watchdog looks only once a round), and kept for the record.
void Watchdog::keep_stacks_before_timeout() {
  const auto pending = group_->recorder().oldest_pending();
  if (!pending || !stacks::supported()) return;
  const double timeout = std::chrono::duration<double>(group_->options().timeout).count();
  const double rounds = 2 * std::chrono::duration<double>(options_.progress_interval).count();
  if (wall_time() - pending->start < std::max(timeout - rounds, timeout / 2)) return;
  // Held while taking them: a record written meanwhile (the timeout came) waits for these.
  std::lock_guard<std::timed_mutex> lock(stacks_mutex_);
  if (kept_stacks_ && kept_stacks_->seq == pending->seq) return;
  kept_stacks_ = take_stacks(
      pending->seq, fmt::format("collective #{} {} about to time out", pending->seq, pending->op));
}

Watchdog::Stacks Watchdog::stacks_for_record(const std::string& reason) {
  {
    std::unique_lock<std::timed_mutex> lock(stacks_mutex_, std::chrono::seconds(2));
    if (lock.owns_lock() && kept_stacks_) {
      for (const auto& r : group_->recorder().records()) {
        if (r.seq == kept_stacks_->seq && r.state != CollectiveState::kDone) return *kept_stacks_;
      }
    }
  }
  const auto pending = group_->recorder().oldest_pending();
  return take_stacks(pending ? pending->seq : 0, reason);
}

std::string Watchdog::dump_flight_record(const std::string& reason) {
  const int rank = group_->rank();
  const Stacks stacks = stacks_for_record(reason);
  std::optional<WaitingIn> waiting_in;
  std::string written;
  for (const std::string* path : {&options_.dump_path, &options_.launcher_copy}) {
    if (path->empty()) continue;
    try {
      std::filesystem::create_directories(std::filesystem::path(*path).parent_path());
      // The stacks once, beside the first record; every copy of the record names that file (the
      // launcher's copies are gone once it has read them).
      if (!waiting_in && !stacks.text.empty()) {
        const std::string stacks_file =
            std::filesystem::path(*path).replace_extension(".stacks.txt").string();
        write_file_atomically(stacks_file, stacks.text);
        waiting_in = stacks.waiting_in.value_or(WaitingIn{});
        waiting_in->stacks_file = stacks_file;
      }
      write_file_atomically(*path, group_->recorder().to_json(rank, group_->world_size(), backend_,
                                                              reason, waiting_in));
      if (written.empty()) written = *path;
    } catch (const std::exception& e) {
      log::error("rank {}: could not write the flight record {}: {}", rank, *path, e.what());
    }
  }
  return written;
}

}  // namespace ddp::comm
