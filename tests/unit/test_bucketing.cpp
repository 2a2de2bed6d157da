// Bucket assignment against c10d's own compute_bucket_assignment_by_size (LibTorch's reducer),
// on the d2l ResNet-18's parameter list and on mixed dtypes.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <climits>

#include "ddp/core/bucketing.h"
#include "ddp/core/zero_redundancy_optimizer.h"

// c10d's function, exported by libtorch_cpu. Declared here with its 1.13 signature because
// Debian's reducer.hpp includes a header Debian does not ship.
namespace c10d {
class Logger;
std::tuple<std::vector<std::vector<size_t>>, std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<at::Tensor>& tensors, const std::vector<size_t>& bucket_size,
    const std::vector<bool>& expect_sparse_gradient, const std::vector<int64_t>& tensor_indices,
    const c10::optional<std::weak_ptr<c10d::Logger>>& logger);
}  // namespace c10d

namespace {

using ddp::core::assign_buckets;
using ddp::core::BucketAssignment;

// The d2l ResNet-18 for 1 input channel and 10 classes, parameters in registration order:
// b1 (conv, bn), then per residual block conv1, conv2, [conv3 1x1], bn1, bn2; then fc.
std::vector<torch::Tensor> resnet18_parameters() {
  std::vector<torch::Tensor> p;
  auto conv = [&](int64_t out, int64_t in, int64_t k) {
    p.push_back(torch::empty({out, in, k, k}));
    p.push_back(torch::empty({out}));
  };
  auto bn = [&](int64_t c) {
    p.push_back(torch::empty({c}));
    p.push_back(torch::empty({c}));
  };
  auto residual = [&](int64_t in, int64_t out, bool conv1x1) {
    conv(out, in, 3);
    conv(out, out, 3);
    if (conv1x1) conv(out, in, 1);
    bn(out);
    bn(out);
  };
  conv(64, 1, 3);
  bn(64);
  residual(64, 64, false);
  residual(64, 64, false);
  for (int64_t c : {128, 256, 512}) {
    residual(c / 2, c, true);
    residual(c, c, false);
  }
  p.push_back(torch::empty({10, 512}));
  p.push_back(torch::empty({10}));
  return p;
}

BucketAssignment c10d_assignment(const std::vector<torch::Tensor>& tensors,
                                 const std::vector<size_t>& limits,
                                 const std::vector<int64_t>& order) {
  std::vector<torch::Tensor> visited = tensors;
  if (!order.empty()) {
    for (size_t i = 0; i < order.size(); ++i) visited[i] = tensors[static_cast<size_t>(order[i])];
  }
  auto [buckets, sizes] = c10d::compute_bucket_assignment_by_size(visited, limits, {}, order, {});
  return {buckets, sizes};
}

void expect_same_as_c10d(const std::vector<torch::Tensor>& tensors,
                         const std::vector<size_t>& limits, const std::vector<int64_t>& order) {
  const auto ours = assign_buckets(ddp::core::slots_of(tensors), limits, order);
  const auto theirs = c10d_assignment(tensors, limits, order);
  EXPECT_EQ(ours.buckets, theirs.buckets);
  EXPECT_EQ(ours.size_limits, theirs.size_limits);
}

const std::vector<size_t> kDdpLimits = {ddp::core::kDefaultFirstBucketBytes,
                                        ddp::core::kDefaultBucketCapBytes};

TEST(Bucketing, ResNet18HasTheTutorialsParameterCount) {
  int64_t n = 0;
  for (const auto& t : resnet18_parameters()) n += t.numel();
  EXPECT_EQ(n, 11175818);
}

TEST(Bucketing, ResNet18InRegistrationOrderEqualsC10d) {
  expect_same_as_c10d(resnet18_parameters(), kDdpLimits, {});
}

TEST(Bucketing, ResNet18InReverseOrderEqualsC10d) {
  const auto params = resnet18_parameters();
  const auto order = ddp::core::reverse_order(params.size());
  expect_same_as_c10d(params, kDdpLimits, order);
  // What DDP starts from: the first (1 MiB) bucket holds the last layers' gradients.
  const auto ours = assign_buckets(ddp::core::slots_of(params), kDdpLimits, order);
  EXPECT_EQ(ours.buckets.front().front(), params.size() - 1);
  EXPECT_EQ(ours.size_limits.front(), ddp::core::kDefaultFirstBucketBytes);
  EXPECT_GE(ours.buckets.size(), 2U);
}

TEST(Bucketing, OneUnlimitedBucketEqualsC10d) {
  expect_same_as_c10d(resnet18_parameters(), {SIZE_MAX}, {});
}

TEST(Bucketing, SmallCapsEqualC10d) {
  expect_same_as_c10d(resnet18_parameters(), {1024, 64 * 1024}, {});
  auto params = resnet18_parameters();
  std::vector<int64_t> shuffled(params.size());
  for (size_t i = 0; i < shuffled.size(); ++i)
    shuffled[i] = static_cast<int64_t>((i * 7) % shuffled.size());
  expect_same_as_c10d(params, {1024, 64 * 1024}, shuffled);
}

TEST(Bucketing, DtypesGetBucketsOfTheirOwn) {
  std::vector<torch::Tensor> mixed;
  for (int i = 0; i < 12; ++i) {
    mixed.push_back(torch::empty({1000 * (i + 1)}, i % 3 == 0 ? torch::kDouble : torch::kFloat));
  }
  expect_same_as_c10d(mixed, {8000, 40000}, {});
  const auto ours = assign_buckets(ddp::core::slots_of(mixed), {8000, 40000});
  for (const auto& bucket : ours.buckets) {
    for (size_t i : bucket) EXPECT_EQ(mixed[i].scalar_type(), mixed[bucket.front()].scalar_type());
  }
}

}  // namespace

// ZeroRedundancyOptimizer's partition, PyTorch's rule: largest first (stable), each to the rank
// with the fewest elements so far, the lowest on ties.
TEST(ZeroPartition, LargestFirstToTheLightestRank) {
  // The DDP test net: a.weight 256, a.bias 32, b.weight 1024, b.bias 32, c.weight 128, c.bias 4.
  const std::vector<int64_t> numels = {256, 32, 1024, 32, 128, 4};
  // 1024 -> 0; 256 -> 1; 128 -> 2 (128); 32 -> 2 (160); 32 -> 2 (192); 4 -> 2 (196).
  EXPECT_EQ(ddp::partition_parameters(numels, 3), (std::vector<int>{1, 2, 0, 2, 2, 2}));
  // 1024 -> 0; 256, 128, 32, 32, 4 -> 1 (452 < 1024 throughout).
  EXPECT_EQ(ddp::partition_parameters(numels, 2), (std::vector<int>{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(ddp::partition_parameters({5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(ddp::partition_parameters({7}, 3), (std::vector<int>{0}));  // ranks may own nothing
  EXPECT_EQ(ddp::partition_parameters(numels, 1), std::vector<int>(6, 0));
}

// A rank that owns no parameter gets an optimizer of none, which must step and save.
TEST(ZeroPartition, AnOptimizerOfNoParametersStepsAndSaves) {
  torch::optim::Adam adam(std::vector<torch::Tensor>{}, torch::optim::AdamOptions(0.1));
  EXPECT_NO_THROW(adam.step());
  torch::serialize::OutputArchive archive;
  EXPECT_NO_THROW(adam.save(archive));
}
