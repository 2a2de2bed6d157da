// CPU tensors through LibTorch's c10d ProcessGroupGloo over the job's store.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

#include "backends.h"
#include "job_store.h"

namespace ddp::comm {
namespace {

// Wraps c10d's work: turns its failures into CommError, and finishes kAvg (gloo has no AVG in
// c10d 1.13) by dividing the sum in place once it has arrived.
class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, CollectiveInfo info, std::string timeout_message,
           at::Tensor divide)
      : work_(std::move(work)),
        info_(std::move(info)),
        timeout_message_(std::move(timeout_message)),
        divide_(std::move(divide)) {}

  void wait() override {
    if (done_) return;
    try {
      work_->wait();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos) {
        throw CommError(info_, timeout_message_);
      }
      throw CommError(info_, failure_message(info_, "gloo", what));
    }
    if (divide_.defined()) sum_to_average(divide_, info_.world_size);
    done_ = true;
  }
  bool is_completed() override { return done_ || work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  CollectiveInfo info_;
  std::string timeout_message_;
  at::Tensor divide_;  // defined for kAvg
  bool done_ = false;
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

void check_cpu(const at::Tensor& t, const CollectiveInfo& info) {
  if (!t.device().is_cpu()) {
    throw InputError(fmt::format("rank {}: {}: backend gloo needs CPU tensors, got one on {}",
                                 info.rank, info.op, t.device().str()));
  }
}

// Progress in the rendezvous store, under keys of our own ("ddp/progress/<rank>").
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

class GlooProcessGroup : public ProcessGroup {
 public:
  GlooProcessGroup(const LaunchInfo& launch, const ProcessGroupOptions& options)
      : ProcessGroup(launch.rank, launch.world_size, options) {
    auto store = connect_store(launch, options.rendezvous_timeout);
    set_progress_board(std::make_shared<StoreProgressBoard>(store));
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(make_device(launch));
    opts->threads = 2;  // as torch.distributed does for one device
    try {
      pg_ =
          c10::make_intrusive<c10d::ProcessGroupGloo>(store, launch.rank, launch.world_size, opts);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw CommError(rendezvous_info(launch),
                      fmt::format("rank {}: gloo could not connect the {} ranks: {}", launch.rank,
                                  launch.world_size, what.substr(0, what.find('\n'))));
    }
  }
  std::string backend_name() const override { return "gloo"; }

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, const CollectiveInfo& info) override {
    check_cpu(tensor, info);
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    return wrap(pg_->allreduce(tensors, opts), info, op == ReduceOp::kAvg ? tensor : at::Tensor());
  }
  WorkPtr do_broadcast(at::Tensor& tensor, int root, const CollectiveInfo& info) override {
    check_cpu(tensor, info);
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return wrap(pg_->broadcast(tensors, opts), info);
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input,
                        const CollectiveInfo& info) override {
    check_cpu(input, info);
    check_cpu(output, info);
    // c10d wants one output tensor per rank: views into the flat output, so no copy follows.
    std::vector<std::vector<at::Tensor>> outputs(1);
    const auto flat = input.reshape({-1});
    for (int r = 0; r < world_size(); ++r)
      outputs[0].push_back(output.narrow(0, r * input.numel(), input.numel()));
    std::vector<at::Tensor> inputs{flat};
    return wrap(pg_->allgather(outputs, inputs, c10d::AllgatherOptions()), info);
  }
  WorkPtr do_barrier(const CollectiveInfo& info) override {
    return wrap(pg_->barrier(c10d::BarrierOptions()), info);
  }

 private:
  WorkPtr wrap(c10::intrusive_ptr<c10d::Work> work, const CollectiveInfo& info,
               at::Tensor divide = at::Tensor()) {
    return std::make_shared<GlooWork>(std::move(work), info, timeout_message(info),
                                      std::move(divide));
  }

  // GLOO_SOCKET_IFNAME names an interface as in PyTorch; a job on one host uses loopback;
  // otherwise gloo binds to the address this host's name resolves to. Never MASTER_ADDR:
  // that is another machine's address on every node but the first.
  static std::shared_ptr<::gloo::transport::Device> make_device(const LaunchInfo& launch) {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
        ifname != nullptr && *ifname != '\0') {
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    }
    if (launch.local_world_size == launch.world_size) {
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    }
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_gloo_process_group(const LaunchInfo& launch,
                                                      const ProcessGroupOptions& options) {
  return std::make_unique<GlooProcessGroup>(launch, options);
}

}  // namespace ddp::comm
