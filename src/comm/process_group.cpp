#include "ddp/comm/process_group.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "ddp/common/files.h"
#include "ddp/common/log.h"

namespace ddp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

void sum_to_average(at::Tensor& sum, int world_size) {
  if (at::isIntegralType(sum.scalar_type(), /*includeBool=*/false)) {
    sum.div_(world_size, "trunc");
  } else {
    sum.div_(world_size);
  }
}

std::string failure_message(const CollectiveInfo& info, const std::string& backend,
                            const std::string& why) {
  return fmt::format("rank {}: {} #{} failed on backend {}: {}", info.rank, info.op, info.seq,
                     backend, why.substr(0, why.find('\n')));
}

CommError::CommError(CollectiveInfo info, const std::string& what)
    : Error(what, kExitFailure), info_(std::move(info)) {}

namespace {

// A backend's Work that tells the flight recorder when it is done or failed.
class RecordedWork : public Work {
 public:
  RecordedWork(WorkPtr inner, std::shared_ptr<FlightRecorder> recorder, uint64_t seq)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), seq_(seq) {}
  void wait() override {
    try {
      inner_->wait();
    } catch (...) {
      recorder_->finished(seq_, false);
      throw;
    }
    recorder_->finished(seq_, true);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t seq_;
};

}  // namespace

std::string stall_message(int rank, const CollectiveRecord& stalled, double waited_s,
                          const std::vector<uint64_t>& progress) {
  std::string behind;
  for (size_t r = 0; r < progress.size(); ++r) {
    if (progress[r] < stalled.seq) {
      behind += fmt::format("{}{} (at #{})", behind.empty() ? "" : ", ", r, progress[r]);
    }
  }
  std::string who;
  if (progress.empty()) {
    who = "which ranks have not entered it is unknown on this backend (see ddp_train --diagnose)";
  } else if (behind.empty()) {
    who = "every rank has entered it: one may be stuck inside it";
  } else {
    who = "not entered by rank(s) " + behind;
  }
  return fmt::format("rank {}: {} #{} ({}) has waited {:.0f} s for the other ranks; {}", rank,
                     stalled.op, stalled.seq, stalled.phase, waited_s, who);
}

ProcessGroup::ProcessGroup(int rank, int world_size, ProcessGroupOptions options)
    : rank_(rank), world_size_(world_size), options_(options) {
  // The test hook of the hang tests: DDP_TEST_DELAY_SEQ=N, DDP_TEST_DELAY_RANK=r and
  // DDP_TEST_DELAY_S=s make rank r wait s seconds before issuing its N-th collective.
  if (const char* seq = std::getenv("DDP_TEST_DELAY_SEQ")) {
    test_delay_.seq = std::strtoull(seq, nullptr, 10);
    const char* delay_rank = std::getenv("DDP_TEST_DELAY_RANK");
    const char* seconds = std::getenv("DDP_TEST_DELAY_S");
    test_delay_.rank = delay_rank != nullptr ? std::atoi(delay_rank) : 0;
    test_delay_.seconds = seconds != nullptr ? std::atof(seconds) : 0.0;
  }
}

ProcessGroup::~ProcessGroup() {
  if (!watchdog_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    watchdog_stop_ = true;
  }
  watchdog_wake_.notify_all();
  watchdog_.join();
}

void ProcessGroup::start_watchdog(WatchdogOptions options) {
  if (watchdog_.joinable()) return;
  watchdog_options_ = std::move(options);
  dump_requests_seen_ = flight_dump_requests();  // requests before it started are not its own
  backend_ = backend_name();  // the watchdog never calls a virtual function of a dying group
  watchdog_ = std::thread([this] { watch(); });
}

void ProcessGroup::watch() {
  std::unique_lock<std::mutex> lock(watchdog_mutex_);
  while (!watchdog_wake_.wait_for(lock, watchdog_options_.progress_interval,
                                  [this] { return watchdog_stop_; })) {
    lock.unlock();
    if (const uint64_t requests = flight_dump_requests(); requests != dump_requests_seen_) {
      dump_requests_seen_ = requests;
      const auto path = dump_flight_record("SIGUSR1");
      if (!path.empty()) log::warn("rank {}: flight record written to {}", rank_, path);
    }
    const uint64_t seq = recorder_->last_issued();
    if (board_ && seq != published_seq_) {
      try {
        board_->publish(rank_, seq);
        published_seq_ = seq;
      } catch (const std::exception& e) {  // the store may be gone at the end of a failed run
        log::debug("rank {}: could not publish progress: {}", rank_, e.what());
      }
    }
    check_stall();
    lock.lock();
  }
}

void ProcessGroup::check_stall() {
  const auto limit = std::chrono::duration<double>(watchdog_options_.stall_warning).count();
  if (limit <= 0) return;
  const auto pending = recorder_->oldest_pending();
  if (!pending || pending->seq == warned_seq_) return;
  const double waited = wall_time() - pending->start;
  if (waited < limit) return;
  warned_seq_ = pending->seq;
  std::vector<uint64_t> progress;
  try {
    if (board_) progress = board_->read(world_size_);
  } catch (const std::exception& e) {
    log::debug("rank {}: could not read the other ranks' progress: {}", rank_, e.what());
  }
  log::warn("{}", stall_message(rank_, *pending, waited, progress));
}

std::string ProcessGroup::dump_flight_record(const std::string& reason) {
  // The options are set by start_watchdog(), together with backend_.
  const std::string json = recorder_->to_json(rank_, world_size_, backend_, reason);
  std::string written;
  for (const std::string* path : {&watchdog_options_.dump_path, &watchdog_options_.launcher_copy}) {
    if (path->empty()) continue;
    try {
      std::filesystem::create_directories(std::filesystem::path(*path).parent_path());
      write_file_atomically(*path, json);
      if (written.empty()) written = *path;
    } catch (const std::exception& e) {
      log::error("rank {}: could not write the flight record {}: {}", rank_, *path, e.what());
    }
  }
  return written;
}

template <class Issue>
WorkPtr ProcessGroup::recorded(const CollectiveInfo& info, Issue issue) {
  try {
    return std::make_shared<RecordedWork>(issue(), recorder_, info.seq);
  } catch (...) {
    recorder_->finished(info.seq, false);
    throw;
  }
}

CollectiveInfo ProcessGroup::next_info(std::string op, const at::Tensor* tensor) {
  CollectiveInfo info;
  info.op = std::move(op);
  info.seq = ++seq_;
  info.rank = rank_;
  info.world_size = world_size_;
  if (tensor != nullptr) {
    info.numel = tensor->numel();
    info.dtype = dtype_name(tensor->scalar_type());
  }
  if (test_delay_.seq == info.seq && test_delay_.rank == rank_) {
    log::warn("rank {}: test hook: waiting {} s before {} #{}", rank_, test_delay_.seconds, info.op,
              info.seq);
    std::this_thread::sleep_for(std::chrono::duration<double>(test_delay_.seconds));
  }
  // Recorded as issued before the backend sees it: a backend call that blocks shows as waiting.
  recorder_->issued(info.seq, info.op,
                    tensor == nullptr ? 0 : static_cast<int64_t>(tensor->nbytes()));
  return info;
}

std::string ProcessGroup::timeout_message(const CollectiveInfo& info) const {
  return fmt::format(
      "rank {}: {} #{} ({} elements of {}) timed out after {} s on backend {}: expected ranks "
      "0-{} to join it; a rank that crashed, hangs, or issued its collectives in another order "
      "(see Note [Collective order is identical on all ranks]) has not",
      info.rank, info.op, info.seq, info.numel, info.dtype.empty() ? "-" : info.dtype,
      std::chrono::duration<double>(options_.timeout).count(), backend_name(), info.world_size - 1);
}

WorkPtr ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  DDP_CHECK(tensor.is_contiguous(), "all_reduce needs a contiguous tensor");
  const auto info = next_info(fmt::format("all_reduce({})", to_string(op)), &tensor);
  return recorded(info, [&] { return do_all_reduce(tensor, op, info); });
}

WorkPtr ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  DDP_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  DDP_CHECK(root >= 0 && root < world_size_, "broadcast root outside the group");
  const auto info = next_info(fmt::format("broadcast(root {})", root), &tensor);
  return recorded(info, [&] { return do_broadcast(tensor, root, info); });
}

WorkPtr ProcessGroup::all_gather(at::Tensor& output, const at::Tensor& input) {
  DDP_CHECK(output.is_contiguous() && input.is_contiguous(), "all_gather needs contiguous tensors");
  DDP_CHECK(
      output.numel() == input.numel() * world_size_ && output.scalar_type() == input.scalar_type(),
      "all_gather output must be world_size * input.numel() of input's dtype");
  const auto info = next_info("all_gather", &input);
  return recorded(info, [&] { return do_all_gather(output, input, info); });
}

WorkPtr ProcessGroup::barrier() {
  const auto info = next_info("barrier", nullptr);
  return recorded(info, [&] { return do_barrier(info); });
}

}  // namespace ddp::comm
