// TORCH_DISTRIBUTED_DEBUG=DETAIL's comparison (comm/diagnostics/collective_check.h): the signatures
// as they travel, and the message that names each differing rank and both calls.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/diagnostics/collective_check.h"
#include "ddp/comm/host_collectives.h"
#include "errors.h"

namespace {

using ddp::comm::CallSignature;
using Kind = CallSignature::Kind;

CallSignature call(Kind kind, int64_t arg, c10::ScalarType dtype, std::vector<int64_t> shape,
                   uint64_t seq = 5) {
  CallSignature c;
  c.kind = kind;
  c.arg = arg;
  c.dtype = static_cast<int64_t>(dtype);
  c.device = static_cast<int64_t>(c10::DeviceType::CPU);
  c.shape = std::move(shape);
  c.seq = seq;
  return c;
}

const CallSignature kAllReduce10 = call(Kind::kAllReduce, 0, torch::kFloat32, {10});

TEST(CollectiveCheck, ASignatureTravelsAsFixedWordsAndComesBackEqual) {
  for (const auto& c : {kAllReduce10, call(Kind::kBroadcast, 2, torch::kInt64, {3, 4, 5}),
                        call(Kind::kBarrier, 0, torch::kFloat32, {})}) {
    const auto words = ddp::comm::encode(c);
    ASSERT_EQ(static_cast<int64_t>(words.size()), ddp::comm::kSignatureWords);
    EXPECT_EQ(ddp::comm::decode(words.data()), c) << ddp::comm::describe(c);
  }
  // More dimensions than travel: two that differ only beyond them still differ (element count).
  auto a = call(Kind::kAllGather, 0, torch::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 2, 3});
  auto b = call(Kind::kAllGather, 0, torch::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 3, 3});
  EXPECT_FALSE(ddp::comm::decode(ddp::comm::encode(a).data()) ==
               ddp::comm::decode(ddp::comm::encode(b).data()));
}

TEST(CollectiveCheck, TheSameCallOnEveryRankIsNoMismatch) {
  EXPECT_EQ(ddp::comm::mismatch_message({kAllReduce10, kAllReduce10, kAllReduce10}), "");
}

TEST(CollectiveCheck, TheMessageNamesEachDifferingRankAndBothCalls) {
  const auto broadcast12 = call(Kind::kBroadcast, 0, torch::kFloat32, {12});
  EXPECT_EQ(ddp::comm::mismatch_message({kAllReduce10, broadcast12, kAllReduce10}),
            "collective #5: rank 1 calls broadcast(float32[12]) from rank 0, ranks 0 and 2 call "
            "all_reduce(sum, float32[10])");
  // dtype, shape, reduction: each its own group, the smaller groups first, then by lowest rank.
  const auto doubles = call(Kind::kAllReduce, 0, torch::kFloat64, {10});
  const auto longer = call(Kind::kAllReduce, 0, torch::kFloat32, {11});
  const auto maximum = call(Kind::kAllReduce, 3, torch::kFloat32, {10});
  EXPECT_EQ(
      ddp::comm::mismatch_message({doubles, kAllReduce10, longer, kAllReduce10, maximum}),
      "collective #5: rank 0 calls all_reduce(sum, float64[10]), rank 2 calls "
      "all_reduce(sum, float32[11]), rank 4 calls all_reduce(max, float32[10]), ranks 1 and 3 "
      "call all_reduce(sum, float32[10])");
  EXPECT_EQ(ddp::comm::describe(call(Kind::kNewGroup, 3, torch::kFloat32, {})),
            "new_group(3 ranks)");
}

TEST(CollectiveCheck, TorchDistributedDebugIsReadAsPyTorchReadsIt) {
  using ddp::comm::DebugLevel;
  EXPECT_EQ(ddp::comm::debug_level({}), DebugLevel::kOff);
  EXPECT_EQ(ddp::comm::debug_level({{"TORCH_DISTRIBUTED_DEBUG", "detail"}}), DebugLevel::kDetail);
  EXPECT_EQ(ddp::comm::debug_level({{"TORCH_DISTRIBUTED_DEBUG", "INFO"}}), DebugLevel::kInfo);
  EXPECT_NE(ddp::testing::input_error_of([] {
              ddp::comm::debug_level({{"TORCH_DISTRIBUTED_DEBUG", "VERBOSE"}});
            }).find("TORCH_DISTRIBUTED_DEBUG=VERBOSE: expected OFF, INFO or DETAIL"),
            std::string::npos);
}

// The comparison behind the parameter check, the heal's digest check and the straggler figures'
// step counts (host_collectives.h): the ranks whose row differs from the reference's.
TEST(HostCollectives, RanksDifferingNamesEveryRankWhoseRowDiffersFromTheReference) {
  const auto rows = torch::tensor({1.0, 2.0, 1.0, 2.0, 1.0, 3.0, 5.0, 2.0}).view({4, 2});
  EXPECT_EQ(ddp::comm::ranks_differing(rows, 0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ddp::comm::ranks_differing(rows, 2), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_TRUE(ddp::comm::ranks_differing(rows.narrow(0, 0, 2), 1).empty());
  const auto digests = torch::tensor(std::vector<int64_t>{7, 7, 9}).view({3, 1});
  EXPECT_EQ(ddp::comm::ranks_differing(digests, 0), (std::vector<int64_t>{2}));
}

}  // namespace
