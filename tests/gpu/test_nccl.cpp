// The nccl backend at world size 1: every collective returns its input (avg too), the stream
// protocol makes results visible to the caller's stream, and bad tensors are InputErrors.
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so multi-rank correctness is
// proven on the CPU backends; these tests skip, saying why, where the backend is not built or there
// is no GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/process_group.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/common/error.h"

namespace {

using ddp::comm::ProcessGroup;
using ddp::comm::ReduceOp;

// Why the GPU tests cannot run here, or "" when they can.
std::string skip_reason() {
#ifndef DDP_HAVE_NCCL
  return "nccl backend not compiled in: LibTorch has no CUDA";
#else
  if (!torch::cuda::is_available() || torch::cuda::device_count() == 0) {
    return "no CUDA GPU on this machine";
  }
  return "";
#endif
}

#define SKIP_WITHOUT_NCCL_GPU()                  \
  do {                                           \
    const std::string reason = skip_reason();    \
    if (!reason.empty()) GTEST_SKIP() << reason; \
  } while (0)

std::unique_ptr<ProcessGroup> make_group() {
  ddp::comm::LaunchInfo launch;  // a plain run: rank 0 of 1, local rank 0
  ddp::comm::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  return ddp::comm::create_process_group("nccl", launch, options, /*cuda_device=*/true);
}

torch::TensorOptions on_gpu(torch::ScalarType dtype) {
  return torch::TensorOptions().dtype(dtype).device(torch::kCUDA, 0);
}

// Values with negatives, so that min/max/avg would show any mix-up; exact in every dtype.
torch::Tensor sample(torch::ScalarType dtype) {
  const bool is_unsigned = dtype == torch::kUInt8;
  return torch::arange(is_unsigned ? 0 : -5, is_unsigned ? 10 : 5, on_gpu(dtype));
}

// Runs without a GPU: the test program must agree with the library about whether nccl is in,
// or the GPU tests below would skip on a machine where they should run.
TEST(Nccl, CompiledBackendsMatchTheBuild) {
  const auto backends = ddp::comm::compiled_backends();
  const bool listed = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
#ifdef DDP_HAVE_NCCL
  EXPECT_TRUE(listed) << "DDP_HAVE_NCCL is defined for the test but the library lacks nccl";
#else
  EXPECT_FALSE(listed) << "the library has nccl but the test was built without DDP_HAVE_NCCL";
#endif
}

TEST(Nccl, CreatesAWorldOfOne) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  EXPECT_EQ(pg->backend_name(), "nccl");
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->world_size(), 1);
}

TEST(Nccl, AllReduceAtWorldOneReturnsTheInput) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt64}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      const torch::Tensor expected = sample(dtype);
      torch::Tensor t = expected.clone();
      pg->all_reduce(t, op)->wait();
      EXPECT_TRUE(torch::equal(t.cpu(), expected.cpu()))
          << "dtype " << dtype << ", op " << ddp::comm::to_string(op) << ": " << t;
    }
  }
}

TEST(Nccl, AllReduceTakesEverySupportedDtype) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kFloat16, torch::kBFloat16,
                     torch::kInt32, torch::kInt64, torch::kUInt8, torch::kInt8}) {
    const torch::Tensor expected = sample(dtype);
    torch::Tensor t = expected.clone();
    pg->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(t.cpu(), expected.cpu())) << "dtype " << dtype;
  }
}

TEST(Nccl, BroadcastFromRootZeroKeepsTheTensor) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  const torch::Tensor expected = torch::randn({3, 4}, on_gpu(torch::kFloat32));
  torch::Tensor t = expected.clone();
  pg->broadcast(t, 0)->wait();
  EXPECT_TRUE(torch::equal(t.cpu(), expected.cpu()));
}

TEST(Nccl, AllGatherFillsTheFlatOutput) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  const torch::Tensor input = torch::randn({2, 3}, on_gpu(torch::kFloat64));
  torch::Tensor output = torch::full({6}, -1.0, on_gpu(torch::kFloat64));
  pg->all_gather(output, input)->wait();
  EXPECT_TRUE(torch::equal(output.cpu(), input.flatten().cpu()));
}

// The stream protocol: the collective sees what the caller's stream wrote just before the call,
// the caller's stream sees its result after wait(), and an input dropped right after the call
// keeps its memory until NCCL is done (recordStream). all_gather is out of place, so unlike an
// in-place all-reduce at world 1 it really moves the data.
TEST(Nccl, ResultsFollowTheCallersStream) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  const int64_t n = int64_t{1} << 24;  // 64 MiB: large enough for a missing wait to show
  torch::Tensor output = torch::empty({n}, on_gpu(torch::kFloat32));
  ddp::comm::WorkPtr work;
  {
    torch::Tensor input = torch::full({n}, 2.0, on_gpu(torch::kFloat32));
    input.mul_(3.0);  // queued on the current stream, just before the collective
    work = pg->all_gather(output, input);
  }  // input dropped while the collective may still be queued
  // Would get the input's memory at once, and overwrite it before NCCL read it, without
  // recordStream: the output would then hold 9 + 1.
  torch::Tensor reuse = torch::full({n}, 9.0, on_gpu(torch::kFloat32));
  work->wait();
  output.add_(1.0);  // on the current stream, after wait()
  EXPECT_EQ(output.min().item<float>(), 7.0f);
  EXPECT_EQ(output.max().item<float>(), 7.0f);
}

TEST(Nccl, BarrierCompletes) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  const uint64_t before = pg->last_seq();
  auto work = pg->barrier();
  work->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_EQ(pg->last_seq(), before + 1);
}

TEST(Nccl, RejectsACpuTensor) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  torch::Tensor t = torch::ones({3});
  try {
    pg->all_reduce(t);
    FAIL() << "a CPU tensor was accepted";
  } catch (const ddp::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs CUDA tensors on cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu"), std::string::npos) << what;
  }
}

TEST(Nccl, RejectsANonContiguousTensor) {
  SKIP_WITHOUT_NCCL_GPU();
  auto pg = make_group();
  torch::Tensor t = torch::ones({4, 5}, on_gpu(torch::kFloat32)).t();
  EXPECT_THROW(pg->all_reduce(t), ddp::InputError);
}

}  // namespace
