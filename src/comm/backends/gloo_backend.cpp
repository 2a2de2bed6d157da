// CPU tensors through LibTorch's c10d ProcessGroupGloo over the job's store; CUDA tensors through
// host copies of them, as PyTorch's gloo takes them too.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <functional>

#include "backends/backends.h"
#include "ddp/common/log.h"
#include "ddp/common/socket.h"
#include "store/job_store.h"

namespace ddp::comm {

// Runs `arrived` on gloo's thread when `work` completes (gloo_arrival.cpp).
void on_arrival(c10d::Work& work, std::function<void()> arrived);

namespace {

// A Work settled once, by wait() or by is_completed() once the work under it is done: the wait
// for that work and a finishing step that communicates with no one (so that is_completed() may
// run it as well as wait()). A failure is kept for wait() to throw.
class SettledOnceWork : public Work {
 public:
  void wait() override {
    settle();
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    if (!settled_ && ready()) settle();
    return settled_;
  }

 protected:
  virtual bool ready() = 0;     // the work under it is done; never blocks
  virtual void complete() = 0;  // waits for it, then finishes; may throw
  virtual void release() = 0;   // lets go of the work and its tensors

 private:
  void settle() {
    if (settled_) return;
    try {
      complete();
    } catch (...) {
      error_ = std::current_exception();
    }
    settled_ = true;
    release();
  }

  bool settled_ = false;
  std::exception_ptr error_;
};

// Wraps c10d's work: turns its failures into CommError, and runs `finish` once the data has
// arrived (kAvg's division: gloo has no AVG in c10d 1.13; reduce_scatter's local reduction; a
// copy back into the caller's tensor).
class GlooWork : public SettledOnceWork {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, CollectiveInfo info, std::string timeout_message,
           std::function<void()> finish = nullptr)
      : work_(std::move(work)),
        info_(std::move(info)),
        timeout_message_(std::move(timeout_message)),
        finish_(std::move(finish)) {}

 private:
  bool ready() override { return work_->isCompleted(); }
  void complete() override {
    wait_for_gloo();
    if (finish_) finish_();
  }
  void release() override { finish_ = nullptr; }
  void wait_for_gloo() {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos) {
        throw CommError(info_, timeout_message_);
      }
      throw CommError(info_, failure_message(info_, "gloo", what));
    }
  }

  c10::intrusive_ptr<c10d::Work> work_;
  CollectiveInfo info_;
  std::string timeout_message_;
  std::function<void()> finish_;
};

// Note [A second collective is issued in program order]
// A collective made of two, the second sending the first's result (all_reduce as reduce_scatter
// then all_gather). c10d's gloo pairs the collectives of the ranks by the order in which each rank
// enqueued them, so the second must enter every rank's queue at the same point of its collective
// order. is_completed() is polled at moments that differ between ranks: it never issues it. The
// second is issued by issue_second(), which wait() calls and which the group calls before it
// issues any other collective (GlooProcessGroup::issue_pending): both are points in the order
// of issues, the same on every rank whenever each rank waits.
class TwoPhaseWork : public Work {
 public:
  TwoPhaseWork(WorkPtr first, std::function<WorkPtr()> issue)
      : first_(std::move(first)), issue_(std::move(issue)) {}

  // Waits for the first collective, then issues the second; a failure is kept for wait().
  void issue_second() {
    if (second_ || error_) return;
    try {
      first_->wait();
      second_ = issue_();
    } catch (...) {
      error_ = std::current_exception();
    }
    first_.reset();
    issue_ = nullptr;
  }
  void wait() override {
    issue_second();
    if (error_) std::rethrow_exception(error_);
    second_->wait();
  }
  // False until the second collective has been issued and is done (see the Note above).
  bool is_completed() override {
    return error_ != nullptr || (second_ != nullptr && second_->is_completed());
  }

 private:
  WorkPtr first_;
  std::function<WorkPtr()> issue_;
  WorkPtr second_;
  std::exception_ptr error_;
};

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

// The dtypes c10d's gloo reduces in every LibTorch we support (GENERATE_ALL_TYPES of
// ProcessGroupGloo.cpp in 1.13: no bfloat16, bool or int16). bfloat16 is left out on every
// version, so that it is summed in float32 (all_reduce_in_two_phases) wherever it runs.
bool gloo_reduces(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

// A contiguous tensor's elements as a flat uint8 view of the same memory: gloo moves any dtype
// this way, including those its type switch lacks.
at::Tensor as_bytes(const at::Tensor& t) {
  return t.view({-1}).view(at::kByte);
}

// The reduction over ranks of `blocks` ([world_size, n], row q from rank q) into `out` (n
// elements): 16-bit floats widened to float32 and rounded once at the end; kAvg as all_reduce's
// (sum divided by world_size, truncating for integers).
void reduce_blocks(const at::Tensor& blocks, ReduceOp op, int world_size, const at::Tensor& out) {
  const auto type = blocks.scalar_type();
  const auto wide = type == at::kHalf || type == at::kBFloat16 ? blocks.to(at::kFloat) : blocks;
  at::Tensor reduced;
  if (op == ReduceOp::kMin) {
    reduced = std::get<0>(wide.min(0));
  } else if (op == ReduceOp::kMax) {
    reduced = std::get<0>(wide.max(0));
  } else {
    reduced = wide.sum(0);  // integers sum in int64, wrapped back to their type by the copy
    if (op == ReduceOp::kAvg) sum_to_average(reduced, world_size);
  }
  out.view({-1}).copy_(reduced);
}

void check_device(const at::Tensor& t, const CollectiveInfo& info) {
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw InputError(fmt::format(
        "rank {}: {}: backend gloo needs CPU or CUDA tensors, got one on {}", info.rank, info.op,
        t.device().str()));
  }
}

void check_devices(const at::Tensor& output, const at::Tensor& input, const CollectiveInfo& info) {
  check_device(input, info);
  if (output.device() != input.device()) {
    throw InputError(fmt::format("rank {}: {}: the input is on {}, the output on {}: one device",
                                 info.rank, info.op, input.device().str(),
                                 output.device().str()));
  }
}

// Note [CUDA tensors on gloo]
// gloo moves host memory. A collective of CUDA tensors (ranks that share a GPU, which NCCL
// refuses; a build without NCCL) goes through host copies, as PyTorch's gloo does: the input is
// copied to the host by a blocking copy, which waits for the work queued before it on the current
// stream (the kernels that made the tensor); the host result is copied back into the output when
// the collective is waited for, on the waiting thread's current stream, before wait() returns.
class CopiedBackWork : public SettledOnceWork {
 public:
  CopiedBackWork(WorkPtr work, at::Tensor output, at::Tensor host_output)
      : work_(std::move(work)), output_(std::move(output)), host_output_(std::move(host_output)) {}

 private:
  bool ready() override { return work_->is_completed(); }
  void complete() override {
    work_->wait();
    output_.copy_(host_output_);
  }
  void release() override {
    work_.reset();
    output_ = host_output_ = at::Tensor();
  }

  WorkPtr work_;
  at::Tensor output_, host_output_;
};

// c10d's all-gather of `input` into the flat `output` (world_size blocks), as bytes.
c10::intrusive_ptr<c10d::Work> gather_bytes(c10d::ProcessGroupGloo& pg, const at::Tensor& output,
                                            const at::Tensor& input, int world_size) {
  // c10d wants one output tensor per rank: views into the flat output (c10d still gathers into a
  // flat buffer of its own first, then copies each block into them: one staged copy).
  const auto in = as_bytes(input);
  const auto out = as_bytes(output);
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size; ++r)
    outputs[0].push_back(out.narrow(0, r * in.numel(), in.numel()));
  std::vector<at::Tensor> inputs{in};
  return pg.allgather(outputs, inputs, c10d::AllgatherOptions());
}

// Progress in a store, under keys of our own ("ddp/progress/<rank>"; a subgroup's store has its
// own prefix).
class StoreProgressBoard : public ProcessGroup::ProgressBoard {
 public:
  explicit StoreProgressBoard(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void publish(int rank, uint64_t seq) override {
    const std::string value = std::to_string(seq);
    store_->set(key(rank), std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::vector<uint64_t> read(int world_size) override {
    std::vector<uint64_t> seqs(static_cast<size_t>(world_size), 0);
    for (int r = 0; r < world_size; ++r) {
      if (!store_->check({key(r)})) continue;  // get() would wait for it
      const auto bytes = store_->get(key(r));
      seqs[static_cast<size_t>(r)] =
          std::strtoull(std::string(bytes.begin(), bytes.end()).c_str(), nullptr, 10);
    }
    return seqs;
  }

 private:
  static std::string key(int rank) { return "ddp/progress/" + std::to_string(rank); }
  c10::intrusive_ptr<c10d::Store> store_;
};

using DevicePtr = std::shared_ptr<::gloo::transport::Device>;

// GLOO_SOCKET_IFNAME names an interface as in PyTorch; a job on one host uses loopback;
// otherwise gloo binds to the local address that routes to MASTER_ADDR, which every rank must
// reach anyway. Not the address this host's name resolves to (gloo's and PyTorch's default): on
// many machines that is 127.0.0.1, which other hosts cannot connect to. Only when MASTER_ADDR has
// no route does the host name serve.
DevicePtr make_device(const LaunchInfo& launch) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (launch.local_world_size == launch.world_size) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  const net::Route route = net::route_to(launch.master_addr);
  if (route.source.empty()) {
    log::warn("gloo: no route to MASTER_ADDR {}; binding the address of this host's name",
              launch.master_addr);
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
  log::info("gloo: interface {} ({}) routes to MASTER_ADDR {} (GLOO_SOCKET_IFNAME overrides)",
            route.interface.empty() ? "?" : route.interface, route.source, launch.master_addr);
  return c10d::ProcessGroupGloo::createDeviceForHostname(route.source);
}

// gloo's TCP pairs write with writev(), which raises SIGPIPE where the peer has gone: a C++ rank
// died of it (exit 141) when its peer left in the middle of a collective, where Python, which
// ignores SIGPIPE, gets gloo's error. A peer's exit must end the collective with an error naming
// it, so the default action (death) is replaced by "ignore"; a handler the program set stays.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

class GlooProcessGroup : public ProcessGroup {
 public:
  // The world group over the job's store, or a subgroup over a prefix of its parent's store; the
  // gloo device is shared. Connects the `size` ranks; when they do not connect, throws a
  // CommError with `context` (the rendezvous, or the new_group) whose message starts with `head`.
  GlooProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, DevicePtr device,
                   const ProcessGroupOptions& options, const CollectiveInfo& context,
                   const std::string& head)
      : ProcessGroup(rank, size, options), store_(std::move(store)), device_(std::move(device)) {
    set_progress_board(std::make_shared<StoreProgressBoard>(store_));
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(device_);
    opts->threads = 2;  // as torch.distributed does for one device
    ignore_sigpipe_unless_handled();
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank, size, opts);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw CommError(context, fmt::format("{}: gloo could not connect the {} ranks: {}", head,
                                           size, what.substr(0, what.find('\n'))));
    }
  }
  std::string backend_name() const override { return "gloo"; }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    check_device(tensor, info);
    if (tensor.is_cuda()) {
      return through_host(tensor, tensor, [&](at::Tensor& out, const at::Tensor&) {
        return do_all_reduce(out, op, info);
      });
    }
    issue_pending();
    if (!gloo_reduces(tensor.scalar_type())) return all_reduce_in_two_phases(tensor, op, info);
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    std::function<void()> finish;
    if (op == ReduceOp::kAvg) {
      finish = [t = tensor, w = world_size()]() mutable { sum_to_average(t, w); };
    }
    return wrap(pg_->allreduce(tensors, opts), info, std::move(finish));
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    check_device(tensor, info);
    if (tensor.is_cuda()) {
      return through_host(tensor, tensor, [&](at::Tensor& out, const at::Tensor&) {
        return do_broadcast(out, root, info);
      });
    }
    issue_pending();
    std::vector<at::Tensor> tensors{as_bytes(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return wrap(pg_->broadcast(tensors, opts), info);
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    check_devices(output, input, info);
    if (input.is_cuda()) {
      return through_host(output, input, [&](at::Tensor& out, const at::Tensor& in) {
        return do_all_gather(out, in, info);
      });
    }
    issue_pending();
    // Nothing to move, the same on every rank; gloo's all-gather divides by the size (SIGFPE).
    if (input.numel() == 0) return std::make_shared<CompletedWork>();
    return wrap(gather_bytes(*pg_, output, input, world_size()), info);
  }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            const CollectiveInfo& info) override {
    check_devices(output, input, info);
    if (input.is_cuda()) {
      return through_host(output, input, [&](at::Tensor& out, const at::Tensor& in) {
        return do_reduce_scatter(out, in, op, info);
      });
    }
    issue_pending();
    return reduce_scatter_through_all_to_all(output, input, op, info);
  }
  WorkPtr do_all_to_all(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    check_devices(output, input, info);
    if (input.is_cuda()) {
      return through_host(output, input, [&](at::Tensor& out, const at::Tensor& in) {
        return do_all_to_all(out, in, info);
      });
    }
    issue_pending();
    if (input.numel() == 0) return std::make_shared<CompletedWork>();  // the same on every rank
    return wrap(exchange_bytes(output, input), info);
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    issue_pending();
    return wrap(pg_->barrier(c10d::BarrierOptions()), info);
  }
  std::shared_ptr<ProcessGroup> do_new_group(const std::vector<int>& ranks,
                                             const CollectiveInfo& info) override;

 private:
  WorkPtr wrap(c10::intrusive_ptr<c10d::Work> work, const CollectiveInfo& info,
               std::function<void()> finish = nullptr) {
    on_arrival(*work, arrival_marker(info.seq));  // the flight record's arrival
    return std::make_shared<GlooWork>(std::move(work), info, timeout_message(info),
                                      std::move(finish));
  }

  // `run(host_output, host_input)`, the collective on host copies of CUDA tensors, its result
  // copied back into `output` (Note [CUDA tensors on gloo]). An in-place collective (output is
  // input) has one copy, read and written.
  template <typename Run>
  WorkPtr through_host(const at::Tensor& output, const at::Tensor& input, Run run) {
    at::Tensor host_input = input.cpu();
    at::Tensor host_output = output.is_same(input)
                                 ? host_input
                                 : at::empty(output.sizes(), output.options().device(at::kCPU));
    WorkPtr work = run(host_output, host_input);
    return std::make_shared<CopiedBackWork>(std::move(work), output, std::move(host_output));
  }

  // c10d's all-to-all of equal blocks (empty split sizes), as bytes.
  c10::intrusive_ptr<c10d::Work> exchange_bytes(const at::Tensor& output, const at::Tensor& input) {
    auto out = as_bytes(output);
    auto in = as_bytes(input);
    std::vector<int64_t> output_splits;  // empty: equal blocks
    std::vector<int64_t> input_splits;
    return pg_->alltoall_base(out, in, output_splits, input_splits);
  }

  WorkPtr reduce_scatter_through_all_to_all(const at::Tensor& output, const at::Tensor& input,
                                            ReduceOp op, const CollectiveInfo& info);
  WorkPtr all_reduce_in_two_phases(const at::Tensor& tensor, ReduceOp op,
                                   const CollectiveInfo& info);

  // Issues the second collective of the last two-phase all_reduce, if not yet issued, before this
  // group issues another (Note [A second collective is issued in program order]).
  void issue_pending() {
    if (pending_) pending_->issue_second();
    pending_.reset();
  }

  c10::intrusive_ptr<c10d::Store> store_;
  DevicePtr device_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::shared_ptr<TwoPhaseWork> pending_;
  int groups_made_ = 0;  // new_group calls so far: the same count on every rank
};

// gloo in LibTorch 1.13 has no reduce_scatter: an all-to-all of the bytes brings every rank's
// block r to rank r, which then reduces the world_size blocks itself (reduce_blocks).
WorkPtr GlooProcessGroup::reduce_scatter_through_all_to_all(const at::Tensor& output,
                                                            const at::Tensor& input, ReduceOp op,
                                                            const CollectiveInfo& info) {
  if (output.numel() == 0) return std::make_shared<CompletedWork>();  // the same on every rank
  const auto received = at::empty({input.numel()}, input.options());
  auto finish = [received, output, op, w = world_size()] {
    reduce_blocks(received.view({w, output.numel()}), op, w, output);
  };
  return wrap(exchange_bytes(received, input), info, std::move(finish));
}

// For the dtypes gloo cannot reduce (bfloat16 above all): 16-bit values on the wire, the sum in
// float32. Padded to world_size equal blocks, reduce_scatter, then all_gather of the reduced
// blocks, copied back into `tensor`. The all_gather needs the reduce_scatter's result, so it is
// issued second (Note [A second collective is issued in program order]).
WorkPtr GlooProcessGroup::all_reduce_in_two_phases(const at::Tensor& tensor, ReduceOp op,
                                                   const CollectiveInfo& info) {
  const int64_t n = tensor.numel();
  if (n == 0) return std::make_shared<CompletedWork>();  // the same on every rank
  const int w = world_size();
  const int64_t block = (n + w - 1) / w;
  auto padded = at::zeros({block * w}, tensor.options());  // the padding is reduced, then dropped
  padded.narrow(0, 0, n).copy_(tensor.view({-1}));
  const auto reduced = at::empty({block}, tensor.options());
  auto first = reduce_scatter_through_all_to_all(reduced, padded, op, info);
  auto issue = [pg = pg_, reduced, tensor, n, w, info, message = timeout_message(info)]() {
    const auto gathered = at::empty({reduced.numel() * w}, reduced.options());
    auto copy_back = [gathered, tensor, n] { tensor.view({-1}).copy_(gathered.narrow(0, 0, n)); };
    return WorkPtr(std::make_shared<GlooWork>(gather_bytes(*pg, gathered, reduced, w), info,
                                              message, std::move(copy_back)));
  };
  pending_ = std::make_shared<TwoPhaseWork>(std::move(first), std::move(issue));
  return pending_;
}

// A prefix of this group's store per subgroup: "ddp/group/<k>/" for the k-th new_group call of
// this group, the same k on every rank since all of them call new_group in the same order.
std::shared_ptr<ProcessGroup> GlooProcessGroup::do_new_group(const std::vector<int>& ranks,
                                                             const CollectiveInfo& info) {
  issue_pending();
  const std::string prefix = fmt::format("ddp/group/{}", ++groups_made_);  // PrefixStore adds '/'
  const auto position = std::lower_bound(ranks.begin(), ranks.end(), rank());
  if (position == ranks.end() || *position != rank()) return nullptr;
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
  return std::make_shared<GlooProcessGroup>(
      store, static_cast<int>(position - ranks.begin()), static_cast<int>(ranks.size()), device_,
      options(), info, fmt::format("rank {}: {} #{}", rank(), info.op, info.seq));
}

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_process_group(const LaunchInfo& launch,
                                                      const ProcessGroupOptions& options) {
  auto store = connect_store(launch, options.rendezvous_timeout);
  return std::make_unique<GlooProcessGroup>(store, launch.rank, launch.world_size,
                                            make_device(launch), options, rendezvous_info(launch),
                                            fmt::format("rank {}", launch.rank));
}

std::unique_ptr<ProcessGroup> make_gloo_process_group_on(c10::intrusive_ptr<c10d::Store> store,
                                                         const LaunchInfo& launch,
                                                         const ProcessGroupOptions& options) {
  return std::make_unique<GlooProcessGroup>(std::move(store), launch.rank, launch.world_size,
                                            make_device(launch), options, rendezvous_info(launch),
                                            fmt::format("rank {}", launch.rank));
}

}  // namespace ddp::comm
