// CPU tensors through Open MPI's collectives, for ranks started by mpirun.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "backends/backends.h"
#include "job_thread.h"

namespace ddp::comm {
namespace {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// The one check macro for MPI: a failed call becomes an Error naming file, line, rank and call.
#define DDP_MPI_CHECK(call, rank)                                                                 \
  do {                                                                                            \
    const int ddp_mpi_rc = (call);                                                                \
    if (ddp_mpi_rc != MPI_SUCCESS) {                                                              \
      throw ::ddp::Error(fmt::format("{}:{}: rank {}: {} failed: {}", __FILE__, __LINE__, (rank), \
                                     #call, mpi_error_string(ddp_mpi_rc)));                       \
    }                                                                                             \
  } while (0)

// Set once a collective failed: MPI_Finalize would then wait forever for the peers, so the
// process exits without it and mpirun ends the job.
std::atomic<bool> g_failed{false};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !g_failed.load()) MPI_Finalize();
}

void ensure_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  DDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), -1);
  std::atexit(finalize_at_exit);
}

// The dtypes MPI can reduce with its own operations.
MPI_Datatype to_mpi(const at::Tensor& t, const CollectiveInfo& info) {
  static const std::pair<at::ScalarType, MPI_Datatype> kTypes[] = {
      {at::kFloat, MPI_FLOAT}, {at::kDouble, MPI_DOUBLE}, {at::kLong, MPI_INT64_T},
      {at::kInt, MPI_INT32_T}, {at::kShort, MPI_INT16_T}, {at::kByte, MPI_UINT8_T},
      {at::kChar, MPI_INT8_T},
  };
  for (const auto& [dtype, mpi_type] : kTypes) {
    if (dtype == t.scalar_type()) return mpi_type;
  }
  throw InputError(
      fmt::format("rank {}: {}: backend mpi has no type for {}", info.rank, info.op, info.dtype));
}

enum class Combine { kSum, kMin, kMax };

// An MPI user function over 16-bit floats (T: c10::Half or c10::BFloat16, whose storage is the
// 16 bits on the wire): each combination widens both sides to float32, combines, rounds back.
// Min and max propagate NaN, as torch.minimum and torch.maximum do.
template <class T, Combine kCombine>
void combine_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]);
    const float y = static_cast<float>(b[i]);
    float r;
    if constexpr (kCombine == Combine::kSum) {
      r = x + y;
    } else if constexpr (kCombine == Combine::kMin) {
      r = std::isnan(x) || x < y ? x : y;
    } else {
      r = std::isnan(x) || x > y ? x : y;
    }
    b[i] = static_cast<T>(r);
  }
}

// What MPI lacks, made once after MPI_Init: sum, min and max over float16 and bfloat16 (indexed
// by Combine), and a 16-byte type for moving complex128.
struct UserDefined {
  MPI_Op half[3];
  MPI_Op bfloat16[3];
  MPI_Datatype bytes16;
};

const UserDefined& user_defined() {
  static const UserDefined made = [] {
    UserDefined u{};
    MPI_User_function* const half[] = {combine_16bit<c10::Half, Combine::kSum>,
                                       combine_16bit<c10::Half, Combine::kMin>,
                                       combine_16bit<c10::Half, Combine::kMax>};
    MPI_User_function* const bfloat16[] = {combine_16bit<c10::BFloat16, Combine::kSum>,
                                           combine_16bit<c10::BFloat16, Combine::kMin>,
                                           combine_16bit<c10::BFloat16, Combine::kMax>};
    for (int i = 0; i < 3; ++i) {
      DDP_MPI_CHECK(MPI_Op_create(half[i], /*commute=*/1, &u.half[i]), -1);
      DDP_MPI_CHECK(MPI_Op_create(bfloat16[i], /*commute=*/1, &u.bfloat16[i]), -1);
    }
    DDP_MPI_CHECK(MPI_Type_contiguous(16, MPI_BYTE, &u.bytes16), -1);
    DDP_MPI_CHECK(MPI_Type_commit(&u.bytes16), -1);
    return u;
  }();
  return made;
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
  }
  return MPI_SUM;
}

// The wire type and operation of a reduction: MPI's own, or 16-bit floats as MPI_UINT16_T under
// our user-defined operations (kAvg sums; the caller divides).
std::pair<MPI_Datatype, MPI_Op> reduction_of(const at::Tensor& t, ReduceOp op,
                                             const CollectiveInfo& info) {
  const auto combine = static_cast<size_t>(op == ReduceOp::kMin   ? Combine::kMin
                                           : op == ReduceOp::kMax ? Combine::kMax
                                                                  : Combine::kSum);
  if (t.scalar_type() == at::kHalf) return {MPI_UINT16_T, user_defined().half[combine]};
  if (t.scalar_type() == at::kBFloat16) return {MPI_UINT16_T, user_defined().bfloat16[combine]};
  return {to_mpi(t, info), to_mpi(op)};
}

// Broadcast, all-gather and all-to-all only move elements: any dtype goes as an MPI type of its
// element's size (bool, int16, float16, bfloat16 included).
MPI_Datatype movement_type(const at::Tensor& t, const CollectiveInfo& info) {
  switch (t.element_size()) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    case 8:
      return MPI_UINT64_T;
    case 16:
      return user_defined().bytes16;
    default:
      throw InputError(fmt::format("rank {}: {}: backend mpi cannot move {} ({}-byte elements)",
                                   info.rank, info.op, info.dtype, t.element_size()));
  }
}

int checked_count(const at::Tensor& t, const CollectiveInfo& info) {
  if (!t.device().is_cpu()) {
    throw InputError(fmt::format("rank {}: {}: backend mpi needs CPU tensors, got one on {}",
                                 info.rank, info.op, t.device().str()));
  }
  if (t.numel() > INT_MAX) {
    throw InputError(fmt::format("rank {}: {}: {} elements exceed MPI's int count", info.rank,
                                 info.op, t.numel()));
  }
  return static_cast<int>(t.numel());
}

// Note [Collectives run on the group's thread]: each group runs its collectives on a thread of
// its own, one at a time in the order they were issued, as Open MPI's blocking calls. Blocking,
// because Open MPI's blocking collectives (coll/tuned) are faster than its non-blocking ones
// (libnbc): 0.21 against 0.48 ms for the 2.1 MB of the MLP's bucket on a 2-core host
// (docs/benchmarks.md); and a thread, because a non-blocking collective progresses only inside
// MPI calls, while the thread's goes on as backward runs. One
// thread, in issue order: every rank starts a communicator's collectives in the same order, as
// MPI requires, whichever moment each rank waits for them. MPI_Init asked for
// MPI_THREAD_MULTIPLE, so groups' threads and the caller's MPI calls may overlap.

// A collective queued on (or run by) the group's thread. wait() waits for it until the group's
// timeout, since the MPI call itself has none; a collective that never completes leaves the
// thread in it, and the process ends without MPI_Finalize (g_failed).
class MpiWork : public Work {
 public:
  // No `timeout`: wait() waits as long as it takes.
  MpiWork(CollectiveInfo info, std::string timeout_message,
          std::optional<std::chrono::milliseconds> timeout, at::Tensor divide)
      : info_(std::move(info)),
        timeout_message_(std::move(timeout_message)),
        divide_(std::move(divide)) {
    if (timeout) deadline_ = std::chrono::steady_clock::now() + *timeout;
  }

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!deadline_) {
      done_cv_.wait(lock, [&] { return done_; });
    } else if (!done_cv_.wait_until(lock, *deadline_, [&] { return done_; })) {
      g_failed = true;
      throw CommError(info_, timeout_message_);
    }
    if (rc_ != MPI_SUCCESS) {
      g_failed = true;
      throw CommError(info_, failure_message(info_, "mpi", mpi_error_string(rc_)));
    }
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  // On the group's thread, once the MPI call returned `rc`.
  void finish(int rc) {
    if (rc == MPI_SUCCESS && divide_.defined()) sum_to_average(divide_, info_.world_size);
    std::lock_guard<std::mutex> lock(mu_);
    rc_ = rc;
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  CollectiveInfo info_;
  std::string timeout_message_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  at::Tensor divide_;  // defined for kAvg: the sum becomes the average
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  int rc_ = MPI_SUCCESS;
};

int world_rank() {
  ensure_initialized();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

// Note [A ring reduce-scatter]
// Open MPI 4.1's MPI_Reduce_scatter_block picks, at 4 ranks and tens of MB, its basic linear
// algorithm: a reduce to rank 0, then a scatter, so rank 0 alone holds the whole reduced buffer
// and more (docs/benchmarks.md, "Fully sharded data parallelism"). A ring holds one block besides
// the output on every rank: at step s each rank sends the partial sum it holds of one block to the
// next rank, receives the previous rank's partial sum of another and adds its own part of that
// block into it; after N - 1 steps each rank holds the whole sum of its own block. The partial
// sums alternate between the output and one block of scratch, starting in the one that makes the
// last step's land in the output. Same bytes on the wire as any reduce-scatter, (N - 1) / N of
// the input per rank.
int ring_reduce_scatter(const at::Tensor& input, const at::Tensor& output, int count,
                        MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const int rank = comm_rank(comm), size = comm_size(comm);
  const auto blocks = input.view({size, count});
  const at::Tensor scratch = size > 1 ? at::empty_like(output) : output;
  at::Tensor held = (size - 1) % 2 == 1 ? scratch : output;
  at::Tensor received = held.is_same(output) ? scratch : output;
  held.copy_(blocks[(rank + size - 1) % size]);
  for (int step = 0; step + 1 < size; ++step) {
    const int index = (rank - step - 2 + 2 * size) % size;  // the block received at this step
    int rc = MPI_Sendrecv(held.data_ptr(), count, type, (rank + 1) % size, 0, received.data_ptr(),
                          count, type, (rank + size - 1) % size, 0, comm, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS) {
      rc = MPI_Reduce_local(blocks[index].data_ptr(), received.data_ptr(), count, type, op);
    }
    if (rc != MPI_SUCCESS) return rc;
    std::swap(held, received);
  }
  return MPI_SUCCESS;
}

class MpiProcessGroup : public ProcessGroup {
 public:
  static constexpr int64_t kPartElements = int64_t{1} << 20;

  // Owns `comm` (our own communicator: a duplicate of MPI_COMM_WORLD or a split of a group's),
  // with errors returned instead of aborting the process.
  MpiProcessGroup(MPI_Comm comm, const ProcessGroupOptions& options)
      : ProcessGroup(comm_rank(comm), comm_size(comm), options), comm_(comm) {
    DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), rank());
  }
  // Not after MPI_Finalize (a group kept until exit), nor after a failure (peers may be gone).
  ~MpiProcessGroup() override {
    // Its queued collectives first; one still running past the timeout (a collective the other
    // ranks never join: this rank left by an exception before waiting for it) is left there,
    // and the process ends without MPI_Finalize, which would wait for it too.
    const auto patience = g_failed.load() ? std::chrono::milliseconds(0) : options().timeout;
    if (!thread_.stop(patience)) g_failed = true;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !g_failed.load()) MPI_Comm_free(&comm_);
  }
  std::string backend_name() const override { return "mpi"; }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    const int count = checked_count(tensor, info);
    const auto [type, mpi_op] = reduction_of(tensor, op, info);
    // Large messages go in 4 MB parts, one after the other: Open MPI's all-reduce of one 64 MB
    // message took 39-41 ms here, 16 parts of 4 MB 0.42 ms each.
    return enqueue(
        info,
        [comm = comm_, tensor, count, type = type, mpi_op = mpi_op] {
          auto* base = static_cast<char*>(tensor.data_ptr());
          for (int64_t begin = 0; begin < count; begin += kPartElements) {
            const int n = static_cast<int>(std::min<int64_t>(kPartElements, count - begin));
            const int rc = MPI_Allreduce(MPI_IN_PLACE, base + begin * tensor.element_size(), n,
                                         type, mpi_op, comm);
            if (rc != MPI_SUCCESS) return rc;
          }
          return MPI_SUCCESS;
        },
        op == ReduceOp::kAvg ? tensor : at::Tensor());
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    const int count = checked_count(tensor, info);
    const auto type = movement_type(tensor, info);
    return enqueue(info, [comm = comm_, tensor, count, type, root] {
      return MPI_Bcast(tensor.data_ptr(), count, type, root, comm);
    });
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    const int count = checked_count(input, info);
    checked_count(output, info);
    const auto type = movement_type(input, info);
    return enqueue(info, [comm = comm_, output, input, count, type] {
      return MPI_Allgather(input.data_ptr(), count, type, output.data_ptr(), count, type, comm);
    });
  }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    checked_count(input, info);
    const int count = checked_count(output, info);
    const auto [type, mpi_op] = reduction_of(input, op, info);
    return enqueue(
        info,
        [comm = comm_, output, input, count, type = type, mpi_op = mpi_op] {
          return ring_reduce_scatter(input, output, count, type, mpi_op, comm);
        },
        op == ReduceOp::kAvg ? output : at::Tensor());
  }
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    checked_count(output, info);
    const int block = checked_count(input, info) / world_size();
    const auto type = movement_type(input, info);
    return enqueue(info, [comm = comm_, output, input, block, type] {
      return MPI_Alltoall(input.data_ptr(), block, type, output.data_ptr(), block, type, comm);
    });
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    return enqueue(info, [comm = comm_] { return MPI_Barrier(comm); });
  }
  // MPI_Comm_split of our communicator, keyed by our rank: the members keep their order, so a
  // member's rank in the subgroup is its position in the sorted `ranks`. A collective of the
  // communicator, so it runs on the group's thread after those issued before it; it blocks until
  // every rank of this group has called it, without a timeout (MPI has none for it).
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& info) override {
    const bool member = std::binary_search(ranks.begin(), ranks.end(), rank());
    MPI_Comm sub = MPI_COMM_NULL;
    auto work = std::make_shared<MpiWork>(info, timeout_message(info), std::nullopt, at::Tensor());
    submit(work, [comm = comm_, member, key = rank(), &sub] {
      return MPI_Comm_split(comm, member ? 0 : MPI_UNDEFINED, key, &sub);
    });
    work->wait();
    if (!member) return nullptr;
    return std::make_shared<MpiProcessGroup>(sub, options());
  }

 private:
  // Queues `call` on the group's thread (Note [Collectives run on the group's thread]); the
  // tensors it captured live until it ran. `divide`: kAvg's tensor.
  WorkPtr enqueue(const CollectiveInfo& info, std::function<int()> call,
                  at::Tensor divide = at::Tensor()) {
    auto work = std::make_shared<MpiWork>(info, timeout_message(info), options().timeout,
                                          std::move(divide));
    submit(work, std::move(call));
    return work;
  }
  // `call` (an MPI call; its return code) on the group's thread, for `work` to report.
  void submit(std::shared_ptr<MpiWork> work, std::function<int()> call) {
    thread_.post([work = std::move(work), call = std::move(call)] { work->finish(call()); });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  JobThread thread_;  // Note [Collectives run on the group's thread]
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options) {
  ensure_initialized();
  user_defined();  // our 16-bit operations, made once now that MPI is up
  MPI_Comm comm = MPI_COMM_NULL;
  DDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), world_rank());
  return std::make_unique<MpiProcessGroup>(comm, options);
}

std::string mpi_broadcast_bytes(const std::string& root_value) {
  const int rank = world_rank();
  int length = static_cast<int>(root_value.size());
  DDP_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD), rank);
  std::string out = rank == 0 ? root_value : std::string(static_cast<size_t>(length), '\0');
  DDP_MPI_CHECK(MPI_Bcast(out.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD), rank);
  return out;
}

}  // namespace ddp::comm
