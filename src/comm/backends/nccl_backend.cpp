// The NCCL backend: collectives on CUDA tensors of one device, cuda:LOCAL_RANK, through NCCL's C
// API. The only file that includes <nccl.h> (docs/design.md, "Backend headers").
//
// Compiled for real only where LibTorch has CUDA; elsewhere cmake/DdpNccl.cmake compiles it as a
// check against the CUDA toolkit's headers so that it cannot rot. It must therefore build against
// LibTorch 1.13 (Debian) and 2.x (PyTorch wheels), so it uses only c10/cuda API present in both:
//   c10::cuda::getStreamFromPool(bool, DeviceIndex)     (2.x adds an int-priority overload;
//                                                        passing a bool picks the shared one)
//   c10::cuda::getCurrentCUDAStream(DeviceIndex), CUDAStream::stream()
//   c10::cuda::CUDAGuard / CUDAStreamGuard, c10::cuda::device_count()
//   c10::cuda::CUDACachingAllocator::recordStream(const DataPtr&, CUDAStream)
// Events are raw cudaEvent_t rather than at::cuda::CUDAEvent: that header drags in
// ATen/cuda/CUDAContext.h (cuBLAS, cuSPARSE, cuSOLVER headers) and throws c10::Error, whereas
// here every CUDA failure goes through DDP_CUDA_CHECK and becomes a CommError naming the rank
// and the collective.
//
// Stream protocol (as PyTorch's ProcessGroupNCCL.cpp): each collective
//   1. records an event on the caller's current (compute) stream and makes the group's
//      communication stream wait on it, so NCCL reads the inputs only once they are written;
//   2. runs on the communication stream, so compute queued later overlaps with it;
//   3. tells the caching allocator the tensors are in use on the communication stream
//      (recordStream), so their memory is not handed out again before NCCL is done with it;
//   4. records a done event, which Work::wait() makes the then-current stream wait on.

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/backends.h"

// NCCL before 2.3 has no NCCL_VERSION; its version code used the old formula.
#ifndef NCCL_VERSION
#define NCCL_VERSION(X, Y, Z) ((X)*1000 + (Y)*100 + (Z))
#endif
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
#define DDP_NCCL_HAS_AVG_AND_BF16 1  // ncclAvg and ncclBfloat16 arrived in NCCL 2.10
#endif
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 7, 0)
#define DDP_NCCL_HAS_SEND_RECV 1  // ncclSend and ncclRecv arrived in NCCL 2.7
#endif
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
#define DDP_NCCL_HAS_LAST_ERROR 1  // ncclGetLastError arrived in NCCL 2.13
#endif
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define DDP_NCCL_HAS_NONBLOCKING 1  // ncclConfig_t (blocking = 0) and ncclInProgress: NCCL 2.14
#endif

namespace ddp::comm {
namespace {

// "file:line: rank r: op #seq: " : the common head of every error message of this backend.
std::string error_head(const char* file, int line, const CollectiveInfo& info) {
  return std::string(file) + ":" + std::to_string(line) + ": rank " + std::to_string(info.rank) +
         ": " + info.op + " #" + std::to_string(info.seq) + ": ";
}

[[noreturn]] void throw_nccl_error(const char* file, int line, const char* expr,
                                   ncclResult_t result, const CollectiveInfo& info) {
  std::string what = error_head(file, line, info) + expr + " failed: " + ncclGetErrorString(result);
#ifdef DDP_NCCL_HAS_LAST_ERROR
  // The detail NCCL logged for the last failure (its argument is unused; NULL is documented).
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') what += std::string(" (") + detail + ")";
#endif
  throw CommError(info, what);
}

bool nccl_accepted(ncclResult_t result) {
#ifdef DDP_NCCL_HAS_NONBLOCKING
  if (result == ncclInProgress) return true;
#endif
  return result == ncclSuccess;
}

[[noreturn]] void throw_cuda_error(const char* file, int line, const char* expr, cudaError_t err,
                                   const CollectiveInfo& info) {
  throw CommError(info, error_head(file, line, info) + expr + " failed: " + cudaGetErrorName(err) +
                            ": " + cudaGetErrorString(err));
}

}  // namespace
}  // namespace ddp::comm

// One check macro per foreign library (docs/design.md). Both take the CollectiveInfo of the
// operation in progress, so the CommError they throw names the rank, the collective and its
// sequence number besides file, line, the failed call and the library's own error string.
// ncclInProgress is no failure: a nonblocking communicator's call (an elastic group's) answers it
// while NCCL still connects; enqueue() then waits for the communicator's state to settle.
#define DDP_NCCL_CHECK(expr, info)                                                        \
  do {                                                                                    \
    const ncclResult_t ddp_nccl_result_ = (expr);                                         \
    if (!::ddp::comm::nccl_accepted(ddp_nccl_result_))                                    \
      ::ddp::comm::throw_nccl_error(__FILE__, __LINE__, #expr, ddp_nccl_result_, (info)); \
  } while (0)

#define DDP_CUDA_CHECK(expr, info)                                                       \
  do {                                                                                   \
    const cudaError_t ddp_cuda_error_ = (expr);                                          \
    if (ddp_cuda_error_ != cudaSuccess)                                                  \
      ::ddp::comm::throw_cuda_error(__FILE__, __LINE__, #expr, ddp_cuda_error_, (info)); \
  } while (0)

namespace ddp::comm {
namespace {

using Clock = std::chrono::steady_clock;

#ifdef DDP_NCCL_HAS_AVG_AND_BF16
constexpr bool kNcclHasAvg = true;
#else
constexpr bool kNcclHasAvg = false;  // kAvg is a sum followed by our own division
#endif

// A timeout of zero, negative or milliseconds::max() means "no timeout": wait() then never
// blocks the host (and now + max would overflow).
bool has_deadline(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 && timeout != std::chrono::milliseconds::max();
}
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return has_deadline(timeout) ? Clock::now() + timeout : Clock::time_point::max();
}

// The answer of cudaEventQuery: true when done, false when not yet. A "not ready" answer is not an
// error; clear it so that a later cudaGetLastError (e.g. in ATen) does not report it.
bool event_done(cudaEvent_t event, const CollectiveInfo& info) {
  const cudaError_t answer = cudaEventQuery(event);
  if (answer == cudaSuccess) return true;
  if (answer == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  throw_cuda_error(__FILE__, __LINE__, "cudaEventQuery(done event)", answer, info);
}

// A cudaEvent_t that destroys itself. Created on the current device, without timing (cheaper).
class CudaEvent {
 public:
  explicit CudaEvent(const CollectiveInfo& info) {
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), info);
  }
  // Destroying an event whose record is still pending is allowed: CUDA frees it once reached.
  ~CudaEvent() { (void)cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// The communicator, shared by the group and its pending Work so that neither outlives it.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, std::chrono::milliseconds timeout,
           bool nonblocking)
      : comm_(comm), stream_(stream), timeout_(timeout), nonblocking_(nonblocking) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // ncclCommDestroy flushes pending collectives, so it would hang forever on one whose peers are
  // gone (we are often destroyed while unwinding from such a failure). Give the communication
  // stream the group's timeout to drain, then destroy; if it does not drain, abort instead.
  // A destructor cannot report errors: the return codes are deliberately ignored.
  // A nonblocking (elastic) communicator is aborted: its generation is over, and a destroy would
  // have to be polled to its end.
  ~NcclComm() {
    if (aborted_) return;
    if (nonblocking_) {
      (void)ncclCommAbort(comm_);
      return;
    }
    const bool bounded = has_deadline(timeout_);
    const auto deadline = bounded ? Clock::now() + timeout_ : Clock::time_point::max();
    cudaError_t answer = cudaStreamQuery(stream_);
    while (answer == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      answer = cudaStreamQuery(stream_);
    }
    (void)cudaGetLastError();
    if (answer == cudaSuccess) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
  }

  ncclComm_t get() const { return comm_; }
  bool aborted() const { return aborted_; }
  bool nonblocking() const { return nonblocking_; }

  // Aborts every pending collective of the communicator (releasing peers stuck in them with an
  // error) and frees it; the group is unusable afterwards. Called from any thread (an elastic
  // group's abort watcher), hence the lock shared with async_error().
  void abort() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.exchange(true)) (void)ncclCommAbort(comm_);
  }

  // ncclCommGetAsyncError, never on a communicator another thread has aborted (and so freed).
  // An aborted one answers ncclSuccess: the caller looks at aborted() itself.
  ncclResult_t async_error(const CollectiveInfo& info) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ncclResult_t error = ncclSuccess;
    if (!aborted_) DDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &error), info);
    return error;
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  bool nonblocking_;
  std::mutex mutex_;
  std::atomic<bool> aborted_{false};
};

[[noreturn]] void throw_aborted(const CollectiveInfo& info) {
  throw CommError(info, "rank " + std::to_string(info.rank) + ": " + info.op + " #" +
                            std::to_string(info.seq) +
                            ": the NCCL communicator was aborted (after an earlier failure or "
                            "timeout, or the elastic launcher's notice that a member was lost); "
                            "create a new process group");
}

// Waits until a nonblocking communicator's last call (its init, or a collective NCCL is still
// connecting for) has settled: returns when its state is ncclSuccess; aborts it and throws on an
// error, at `deadline`, or when another thread aborted it (an elastic group's watcher).
void settle(NcclComm& comm, const CollectiveInfo& info, Clock::time_point deadline,
            const std::string& timeout_message) {
  for (;;) {
    if (comm.aborted()) throw_aborted(info);
    const ncclResult_t state = comm.async_error(info);
    if (state == ncclSuccess) return;
#ifdef DDP_NCCL_HAS_NONBLOCKING
    const bool in_progress = state == ncclInProgress;
#else
    const bool in_progress = false;
#endif
    if (!in_progress) {
      comm.abort();
      throw_nccl_error(__FILE__, __LINE__, "ncclCommGetAsyncError", state, info);
    }
    if (Clock::now() >= deadline) {
      comm.abort();
      throw CommError(info, timeout_message);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// An elastic group's watcher: asks `notice` every 50 ms and, once it answers true (the launcher
// lost a member of the generation), aborts the communicator, so that the members' collectives
// (and init) stuck on the lost one return with CommError at once instead of at the timeout. A
// `notice` that throws (the launcher's store is gone) ends the watch: the step's vote reports it.
class AbortWatcher {
 public:
  AbortWatcher(std::function<bool()> notice, std::shared_ptr<NcclComm> comm)
      : thread_([this, notice = std::move(notice), comm = std::move(comm)] {
          std::unique_lock<std::mutex> lock(mutex_);
          while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; })) {
            lock.unlock();  // a store round trip: the destructor need not wait for it
            bool lost = false;
            try {
              lost = notice();
            } catch (const std::exception&) {
              return;
            }
            if (lost) {
              comm->abort();
              return;
            }
            lock.lock();
          }
        }) {}
  AbortWatcher(const AbortWatcher&) = delete;
  AbortWatcher& operator=(const AbortWatcher&) = delete;
  ~AbortWatcher() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// A collective queued on the communication stream; its done event was recorded after it.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, c10::DeviceIndex device, CollectiveInfo info,
           std::string timeout_message, std::chrono::milliseconds timeout)
      : comm_(std::move(comm)),
        device_(device),
        info_(std::move(info)),
        timeout_message_(std::move(timeout_message)),
        bounded_(has_deadline(timeout)),
        deadline_(deadline_after(timeout)),
        done_(info_) {}

  cudaEvent_t done_event() const { return done_.get(); }

  // Like PyTorch, the caller's current stream waits for the collective on the device: kernels
  // queued after wait() see the result, and the host is not blocked. A hang in NCCL (a rank that
  // never joins) would then surface only at the next host sync (e.g. .item()) with no timeout, so
  // when the group has a timeout wait() also blocks the host, polling the done event until it
  // completes or the deadline (timeout after the call) passes. That host sync costs overlap of
  // the caller's CPU with the collective, but keeps the contract of Work::wait(): "throws
  // CommError when the process group's timeout passes".
  void wait() override {
    if (comm_->aborted()) throw_aborted(info_);
    c10::cuda::CUDAGuard guard(device_);
    DDP_CUDA_CHECK(
        cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(), done_.get(), 0),
        info_);
    if (bounded_) wait_on_host();
  }

  bool is_completed() override {
    const cudaError_t answer = cudaEventQuery(done_.get());
    if (answer == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    return true;  // done, or failed (wait() reports the failure)
  }

  // Blocks the host until the collective is done. On an asynchronous NCCL error (a peer died) or
  // at the deadline, aborts the communicator, which also frees the peers stuck in it, and throws.
  void wait_on_host() {
    for (;;) {
      // An abort lets NCCL's kernels end, and the done event with them: their result is void.
      const bool done = event_done(done_.get(), info_);
      if (comm_->aborted()) throw_aborted(info_);
      if (done) return;
      const ncclResult_t async_error = comm_->async_error(info_);
      if (async_error != ncclSuccess) {
        comm_->abort();
        throw_nccl_error(__FILE__, __LINE__, "the collective (ncclCommGetAsyncError)", async_error,
                         info_);
      }
      if (Clock::now() >= deadline_) {
        comm_->abort();
        throw CommError(info_, timeout_message_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  c10::DeviceIndex device_;
  CollectiveInfo info_;
  std::string timeout_message_;  // formatted at the call: Work cannot reach the group later
  bool bounded_;
  Clock::time_point deadline_;
  CudaEvent done_;
};

ncclDataType_t to_nccl_dtype(at::ScalarType type, const CollectiveInfo& info) {
  switch (type) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
#ifdef DDP_NCCL_HAS_AVG_AND_BF16
    case at::kBFloat16:
      return ncclBfloat16;
#endif
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      throw InputError("backend nccl does not support dtype " + std::string(c10::toString(type)) +
                       " (in " + info.op +
                       "); supported: float32, float64, float16, "
#ifdef DDP_NCCL_HAS_AVG_AND_BF16
                       "bfloat16, "
#endif
                       "int32, int64, uint8, int8");
  }
}

// kAvg maps to ncclAvg only where NCCL has it (>= 2.10); the caller then divides itself.
ncclRedOp_t to_nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
#ifdef DDP_NCCL_HAS_AVG_AND_BF16
    case ReduceOp::kAvg:
      return ncclAvg;
#endif
    default:
      return ncclSum;  // kSum, and kAvg without ncclAvg (see kNcclHasAvg)
  }
}

c10::DeviceIndex checked_device(const LaunchInfo& launch) {
  const int visible = c10::cuda::device_count();
  if (launch.local_rank < 0 || launch.local_rank >= visible) {
    throw InputError("backend nccl: local rank " + std::to_string(launch.local_rank) +
                     " needs cuda:" + std::to_string(launch.local_rank) +
                     ", but this process sees " + std::to_string(visible) +
                     " CUDA device(s) (check CUDA_VISIBLE_DEVICES and LOCAL_RANK)");
  }
  return static_cast<c10::DeviceIndex>(launch.local_rank);
}

// What a failure to create a communicator is reported as.
CollectiveInfo init_info(int rank, int world_size) {
  return forming_info("init(ncclCommInitRank)", rank, world_size);
}

// Rank 0 creates the id; `exchange` (TCP store or MPI_Bcast) hands its bytes to every rank.
ncclUniqueId world_unique_id(int rank, const BroadcastBytes& exchange, const CollectiveInfo& info) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  std::string bytes;
  if (rank == 0) {
    DDP_NCCL_CHECK(ncclGetUniqueId(&id), info);
    bytes.assign(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  bytes = exchange(bytes);
  if (bytes.size() != sizeof(id)) {
    throw CommError(info, "rank " + std::to_string(rank) + ": " + info.op +
                              ": the NCCL id from rank 0 has " + std::to_string(bytes.size()) +
                              " bytes, expected " + std::to_string(sizeof(id)));
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

class NcclProcessGroup : public ProcessGroup {
 public:
  // The world group: rank 0's id reaches every rank through `exchange`. With `lost_notice` (an
  // elastic generation's), a watcher aborts the communicator once it answers true, and where
  // NCCL allows the communicator is nonblocking, so that even its init can be aborted.
  NcclProcessGroup(const LaunchInfo& launch, const ProcessGroupOptions& options,
                   const BroadcastBytes& exchange, std::function<bool()> lost_notice)
      : NcclProcessGroup(
            launch.rank, launch.world_size, options, checked_device(launch),
            [&] {
              return world_unique_id(launch.rank, exchange,
                                     init_info(launch.rank, launch.world_size));
            },
            std::move(lost_notice)) {}

  // A communicator of `size` ranks on `device`, joined with the id `unique_id` returns (called
  // once the device is current: the world's exchange, or a subgroup's id from its parent).
  NcclProcessGroup(int rank, int size, const ProcessGroupOptions& options, c10::DeviceIndex device,
                   const std::function<ncclUniqueId()>& unique_id,
                   std::function<bool()> lost_notice = {})
      : ProcessGroup(rank, size, options),
        device_(device),
        comm_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_)) {
    const CollectiveInfo info = init_info(rank, size);
    c10::cuda::CUDAGuard guard(device_);
    const ncclUniqueId id = unique_id();
    ncclComm_t comm = nullptr;
#ifdef DDP_NCCL_HAS_NONBLOCKING
    if (lost_notice) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      DDP_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, id, rank, &config), info);
      comm_ = std::make_shared<NcclComm>(comm, comm_stream_.stream(), options.timeout, true);
      watcher_ = std::make_unique<AbortWatcher>(std::move(lost_notice), comm_);
      settle(*comm_, info, deadline_after(options.rendezvous_timeout),
             "rank " + std::to_string(rank) + ": " + info.op + ": not all " + std::to_string(size) +
                 " ranks joined within the rendezvous timeout");
      return;
    }
#endif
    // Blocks until all `size` ranks have joined. NCCL's blocking init has no timeout of its
    // own; the id's exchange (bounded by options.timeout) is where a missing rank shows up.
    DDP_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank), info);
    comm_ = std::make_shared<NcclComm>(comm, comm_stream_.stream(), options.timeout, false);
    if (lost_notice) watcher_ = std::make_unique<AbortWatcher>(std::move(lost_notice), comm_);
  }

  std::string backend_name() const override {
    return "nccl";
  }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    check_tensor(tensor, "tensor");
    const ncclDataType_t dtype = to_nccl_dtype(tensor.scalar_type(), info);
    if (tensor.numel() == 0) return std::make_shared<CompletedWork>();
    return enqueue({tensor}, info, [&](cudaStream_t stream) {
      DDP_NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), count(tensor), dtype,
                                   to_nccl_op(op), comm_->get(), stream),
                     info);
      // No ncclAvg: divide the sum on the communication stream, before the done event. A plain
      // `if` rather than #if so that this branch is compiled (and checked) with every NCCL.
      if (!kNcclHasAvg && op == ReduceOp::kAvg && world_size() > 1) {
        c10::cuda::CUDAStreamGuard on_comm(comm_stream_);
        sum_to_average(tensor, world_size());
      }
    });
  }

  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    check_tensor(tensor, "tensor");
    const ncclDataType_t dtype = to_nccl_dtype(tensor.scalar_type(), info);
    if (tensor.numel() == 0) return std::make_shared<CompletedWork>();
    return enqueue({tensor}, info, [&](cudaStream_t stream) {
      DDP_NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), count(tensor), dtype, root,
                                   comm_->get(), stream),
                     info);
    });
  }

  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    check_tensor(input, "input");
    check_tensor(output, "output");
    const ncclDataType_t dtype = to_nccl_dtype(input.scalar_type(), info);
    if (output.scalar_type() != input.scalar_type() ||
        output.numel() != input.numel() * world_size()) {
      throw InputError("backend nccl: " + info.op + ": output must have the input's dtype and " +
                       std::to_string(world_size()) + " x " + std::to_string(input.numel()) +
                       " elements; got " + std::to_string(output.numel()) + " elements of " +
                       c10::toString(output.scalar_type()));
    }
    if (input.numel() == 0) return std::make_shared<CompletedWork>();
    return enqueue({output, input}, info, [&](cudaStream_t stream) {
      // Rank r's input lands at offset r * input.numel() of the flat output.
      DDP_NCCL_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), count(input), dtype,
                                   comm_->get(), stream),
                     info);
    });
  }

  // Rank r receives the reduction of every rank's block r.
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    check_tensor(input, "input");
    check_tensor(output, "output");
    const ncclDataType_t dtype = to_nccl_dtype(input.scalar_type(), info);
    if (output.numel() == 0) return std::make_shared<CompletedWork>();
    return enqueue({output, input}, info, [&](cudaStream_t stream) {
      DDP_NCCL_CHECK(ncclReduceScatter(input.data_ptr(), output.data_ptr(), count(output), dtype,
                                       to_nccl_op(op), comm_->get(), stream),
                     info);
      if (!kNcclHasAvg && op == ReduceOp::kAvg && world_size() > 1) {  // as in do_all_reduce
        c10::cuda::CUDAStreamGuard on_comm(comm_stream_);
        sum_to_average(output, world_size());
      }
    });
  }

  // One send and one receive per peer in one NCCL group, which NCCL runs together (no order
  // between the peers to deadlock on).
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    check_tensor(input, "input");
    check_tensor(output, "output");
    const ncclDataType_t dtype = to_nccl_dtype(input.scalar_type(), info);
    if (input.numel() == 0) return std::make_shared<CompletedWork>();
#ifndef DDP_NCCL_HAS_SEND_RECV
    (void)dtype;
    throw InputError("backend nccl: " + info.op + " needs NCCL 2.7 or newer (ncclSend, ncclRecv)");
#else
    const size_t block = count(input) / static_cast<size_t>(world_size());
    const size_t block_bytes = block * input.element_size();
    return enqueue({output, input}, info, [&](cudaStream_t stream) {
      const auto* send = static_cast<const char*>(input.data_ptr());
      auto* recv = static_cast<char*>(output.data_ptr());
      DDP_NCCL_CHECK(ncclGroupStart(), info);
      for (int q = 0; q < world_size(); ++q) {
        const size_t offset = static_cast<size_t>(q) * block_bytes;
        DDP_NCCL_CHECK(ncclSend(send + offset, block, dtype, q, comm_->get(), stream), info);
        DDP_NCCL_CHECK(ncclRecv(recv + offset, block, dtype, q, comm_->get(), stream), info);
      }
      DDP_NCCL_CHECK(ncclGroupEnd(), info);
    });
#endif
  }

  // The subgroup's first rank makes a fresh id; a broadcast over this group's communicator, which
  // every rank of this group joins (new_group is a collective of this group), hands it to the
  // members, who then create the subgroup's communicator together.
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& info) override {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (rank() == ranks.front()) DDP_NCCL_CHECK(ncclGetUniqueId(&id), info);
    const auto size = static_cast<int64_t>(sizeof(id));
    at::Tensor host = at::empty({size}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(host.data_ptr(), &id, sizeof(id));
    at::Tensor bytes = host.to(device());
    auto work = enqueue({bytes}, info, [&](cudaStream_t stream) {
      DDP_NCCL_CHECK(ncclBroadcast(bytes.data_ptr(), bytes.data_ptr(), sizeof(id), ncclUint8,
                                   ranks.front(), comm_->get(), stream),
                     info);
    });
    work->wait_on_host();  // the bytes are final: the copy below need not wait on any stream
    host = bytes.cpu();
    std::memcpy(&id, host.data_ptr(), sizeof(id));
    const auto position = std::lower_bound(ranks.begin(), ranks.end(), rank());
    if (position == ranks.end() || *position != rank()) return nullptr;
    return std::make_shared<NcclProcessGroup>(static_cast<int>(position - ranks.begin()),
                                              static_cast<int>(ranks.size()), options(), device_,
                                              [&id] { return id; });
  }

  // An all-reduce of one element, waited for on the host: a barrier is a host-side meeting point,
  // so it blocks (with the group's timeout, if any) even where wait() would not.
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    auto work = enqueue({token}, info, [&](cudaStream_t stream) {
      DDP_NCCL_CHECK(ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum,
                                   comm_->get(), stream),
                     info);
    });
    work->wait_on_host();
    return std::make_shared<CompletedWork>();
  }

 private:
  at::Device device() const {
    return at::Device(at::kCUDA, device_);
  }
  static size_t count(const at::Tensor& tensor) {
    return static_cast<size_t>(tensor.numel());
  }

  void check_tensor(const at::Tensor& tensor, const char* role) const {
    const std::string head = "backend nccl needs CUDA tensors on cuda:" + std::to_string(device_);
    if (!tensor.defined()) throw InputError(head + "; got an undefined " + role + " tensor");
    if (!tensor.is_cuda()) {
      throw InputError(head + "; got a " +
                       c10::DeviceTypeName(tensor.device().type(), /*lower_case=*/true) + " " +
                       role + " tensor");
    }
    if (tensor.device().index() != device_) {
      throw InputError(head + "; got a " + role +
                       " tensor on cuda:" + std::to_string(tensor.device().index()));
    }
    if (tensor.layout() != at::kStrided || !tensor.is_contiguous()) {
      throw InputError("backend nccl needs dense contiguous tensors; the " + std::string(role) +
                       " tensor is not (call .contiguous())");
    }
  }

  // Runs `launch(comm stream)` under the stream protocol in the header comment.
  template <typename Launch>
  std::shared_ptr<NcclWork> enqueue(const std::vector<at::Tensor>& tensors,
                                    const CollectiveInfo& info, Launch&& launch) {
    if (comm_->aborted()) throw_aborted(info);
    c10::cuda::CUDAGuard guard(device_);
    const cudaStream_t compute = c10::cuda::getCurrentCUDAStream(device_).stream();
    const cudaStream_t comm = comm_stream_.stream();

    auto work =
        std::make_shared<NcclWork>(comm_, device_, info, timeout_message(info), options().timeout);
    // 1. NCCL reads the inputs only after the compute stream has written them.
    CudaEvent inputs_ready(info);
    DDP_CUDA_CHECK(cudaEventRecord(inputs_ready.get(), compute), info);
    DDP_CUDA_CHECK(cudaStreamWaitEvent(comm, inputs_ready.get(), 0), info);
    // 2. The collective itself, on the communication stream.
    launch(comm);
    if (comm_->nonblocking()) {
      settle(*comm_, info, deadline_after(options().timeout), timeout_message(info));
    }
    // 3. The caller may drop the tensors before the collective ran: keep their memory from
    //    being reused by another stream until the communication stream has passed this point.
    for (const at::Tensor& tensor : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), comm_stream_);
    }
    // 4. What wait() waits for.
    DDP_CUDA_CHECK(cudaEventRecord(work->done_event(), comm), info);
    return work;
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream comm_stream_;
  std::shared_ptr<NcclComm> comm_;
  std::unique_ptr<AbortWatcher> watcher_;  // an elastic group's; stopped before comm_ goes
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_process_group(const LaunchInfo& launch,
                                                      const ProcessGroupOptions& options,
                                                      const BroadcastBytes& exchange,
                                                      std::function<bool()> lost_notice) {
  return std::make_unique<NcclProcessGroup>(launch, options, exchange, std::move(lost_notice));
}

std::vector<CudaDevice> cuda_runtime_devices() {
  std::vector<CudaDevice> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDevice device;
    device.index = i;
    device.name = prop.name;
    device.total_memory = prop.totalGlobalMem;
    out.push_back(device);
  }
  return out;
}

}  // namespace ddp::comm
