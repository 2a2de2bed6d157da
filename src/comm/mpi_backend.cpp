// CPU tensors through Open MPI's non-blocking collectives, for ranks started by mpirun.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <thread>
#include <utility>

#include "backends.h"

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

// A pending MPI request. Open MPI progresses non-blocking collectives only inside MPI calls,
// so wait() polls MPI_Test until done or until the group's timeout (MPI_Wait has no timeout).
class MpiWork : public Work {
 public:
  // Starts part `i` of the collective and returns its request.
  using StartPart = std::function<MPI_Request(int64_t i)>;

  MpiWork(StartPart start_part, int64_t parts, CollectiveInfo info, std::string timeout_message,
          std::chrono::milliseconds timeout, at::Tensor divide)
      : start_part_(std::move(start_part)),
        parts_(parts),
        request_(start_part_(0)),
        info_(std::move(info)),
        timeout_message_(std::move(timeout_message)),
        deadline_(std::chrono::steady_clock::now() + timeout),
        divide_(std::move(divide)) {}

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    while (!test(/*may_start_next=*/true)) {
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline_) {
        g_failed = true;
        throw CommError(info_, timeout_message_);
      }
      // Each MPI_Test advances a large collective by a step: yield (not sleep) while it is
      // likely still moving, so an idle core polls at once and a busy one runs the other ranks;
      // past a second it is waiting on a late rank, and 1 ms sleeps leave the core alone.
      if (now - start < std::chrono::seconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  bool is_completed() override { return test(/*may_start_next=*/false); }

 private:
  // Note [Later parts start in wait()]: every rank must start its MPI collectives on a
  // communicator in the same order. The next part of a large all-reduce is therefore started
  // only from wait(), which ranks call in the same order, never from is_completed(), which the
  // reducer polls at moments that differ between ranks (a part started there on one rank before
  // another bucket's all-reduce, and after it on another, made MPI fail with MPI_ERR_TRUNCATE).
  // A completed request is MPI_REQUEST_NULL, which MPI_Test reports complete again.
  bool test(bool may_start_next) {
    if (done_) return true;
    int flag = 0;
    const int rc = MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      g_failed = true;
      throw CommError(info_, failure_message(info_, "mpi", mpi_error_string(rc)));
    }
    if (flag == 0) return false;
    if (part_ + 1 < parts_ && !may_start_next) return false;
    if (++part_ < parts_) {
      request_ = start_part_(part_);
      return false;
    }
    if (divide_.defined()) sum_to_average(divide_, info_.world_size);
    done_ = true;
    return true;
  }

  StartPart start_part_;
  int64_t parts_;
  int64_t part_ = 0;
  MPI_Request request_;
  CollectiveInfo info_;
  std::string timeout_message_;
  std::chrono::steady_clock::time_point deadline_;
  at::Tensor divide_;  // defined for kAvg
  bool done_ = false;
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
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !g_failed.load()) MPI_Comm_free(&comm_);
  }
  std::string backend_name() const override { return "mpi"; }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    const int count = checked_count(tensor, info);
    const auto [type, mpi_op] = reduction_of(tensor, op, info);
    // Large messages go in 4 MB parts, one after the other: Open MPI's non-blocking all-reduce
    // of one 64 MB message (or of several parts at once) ran at 0.2-0.3 GB/s here, against
    // 2-4 GB/s for a single 4 MB message.
    auto* base = static_cast<char*>(tensor.data_ptr());
    const auto element = static_cast<int64_t>(tensor.element_size());
    const int64_t parts = std::max<int64_t>(1, (count + kPartElements - 1) / kPartElements);
    // By value: the Work may outlive the group.
    auto start_part = [comm = comm_, rank = rank(), base, element, count, type = type,
                       mpi_op = mpi_op](int64_t i) {
      const int64_t begin = i * kPartElements;
      const int n = static_cast<int>(std::min<int64_t>(kPartElements, count - begin));
      MPI_Request request;
      DDP_MPI_CHECK(
          MPI_Iallreduce(MPI_IN_PLACE, base + begin * element, n, type, mpi_op, comm, &request),
          rank);
      return request;
    };
    return make_work(start_part, parts, info, op == ReduceOp::kAvg ? tensor : at::Tensor());
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    const int count = checked_count(tensor, info);
    MPI_Request request;
    DDP_MPI_CHECK(
        MPI_Ibcast(tensor.data_ptr(), count, movement_type(tensor, info), root, comm_, &request),
        rank());
    return make_work(started(request), 1, info);
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    const int count = checked_count(input, info);
    checked_count(output, info);
    const auto type = movement_type(input, info);
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallgather(input.data_ptr(), count, type, output.data_ptr(), count, type,
                                 comm_, &request),
                  rank());
    return make_work(started(request), 1, info);
  }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    checked_count(input, info);
    const int count = checked_count(output, info);
    const auto [type, mpi_op] = reduction_of(input, op, info);
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(), count, type,
                                            mpi_op, comm_, &request),
                  rank());
    return make_work(started(request), 1, info, op == ReduceOp::kAvg ? output : at::Tensor());
  }
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    checked_count(output, info);
    const int block = checked_count(input, info) / world_size();
    const auto type = movement_type(input, info);
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ialltoall(input.data_ptr(), block, type, output.data_ptr(), block, type,
                                comm_, &request),
                  rank());
    return make_work(started(request), 1, info);
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm_, &request), rank());
    return make_work(started(request), 1, info);
  }
  // MPI_Comm_split of our communicator, keyed by our rank: the members keep their order, so a
  // member's rank in the subgroup is its position in the sorted `ranks`. It blocks until every
  // rank of this group has called it, without a timeout (MPI has none for it).
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& info) override {
    const bool member = std::binary_search(ranks.begin(), ranks.end(), rank());
    MPI_Comm sub = MPI_COMM_NULL;
    const int rc = MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank(), &sub);
    if (rc != MPI_SUCCESS) {
      g_failed = true;
      throw CommError(info, failure_message(info, "mpi", mpi_error_string(rc)));
    }
    if (!member) return nullptr;
    return std::make_shared<MpiProcessGroup>(sub, options());
  }

 private:
  // A collective started by one call.
  static MpiWork::StartPart started(MPI_Request request) {
    return [request](int64_t) { return request; };
  }
  WorkPtr make_work(MpiWork::StartPart start_part, int64_t parts, const CollectiveInfo& info,
                    at::Tensor divide = at::Tensor()) {
    return std::make_shared<MpiWork>(std::move(start_part), parts, info, timeout_message(info),
                                     options().timeout, std::move(divide));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
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
