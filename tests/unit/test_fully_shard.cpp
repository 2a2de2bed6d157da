// The sharded model's pure layout function and what it refuses, on one process (the local
// backend); the training itself with real ranks is tests/integration/test_fsdp.cpp's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/comm/rendezvous.h"
#include "ddp/core/fully_shard.h"

namespace {

using ddp::fsdp::plan_flat_layout;

std::shared_ptr<ddp::comm::ProcessGroup> local_group() {
  return ddp::comm::create_process_group("local", ddp::comm::LaunchInfo{}, {}, false);
}

TEST(FlatLayout, OffsetsInOrderAndTheTotalPaddedToTheWorld) {
  const auto layout = plan_flat_layout({12, 3, 7}, 4);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 12, 15}));
  EXPECT_EQ(layout.numel, 22);
  EXPECT_EQ(layout.shard, 6);  // ceil(22 / 4)
  EXPECT_EQ(layout.padded, 24);
}

TEST(FlatLayout, ADivisibleTotalIsNotPadded) {
  const auto layout = plan_flat_layout({6, 6}, 3);
  EXPECT_EQ(layout.shard, 4);
  EXPECT_EQ(layout.padded, 12);
}

TEST(FlatLayout, MoreRanksThanElementsGiveEachAtMostOne) {
  const auto layout = plan_flat_layout({1, 2}, 8);
  EXPECT_EQ(layout.shard, 1);
  EXPECT_EQ(layout.padded, 8);
}

TEST(FullyShard, AFrozenParameterInAUnitIsRefusedByName) {
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  net[0]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
  try {
    ddp::FullyShardedDataParallel model(net, local_group());
    FAIL() << "a frozen parameter was sharded";
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0.bias of unit 0 does not require grad"),
              std::string::npos)
        << e.what();
  }
}

TEST(FullyShard, AUnitThatMixesDtypesIsRefusedNamingBoth) {
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  net[0]->as<torch::nn::Linear>()->bias.set_data(torch::zeros({2}, torch::kDouble));
  try {
    ddp::FullyShardedDataParallel model(net, local_group());
    FAIL() << "a unit of two dtypes was sharded";
  } catch (const ddp::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("0.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("0.bias"), std::string::npos) << what;
    EXPECT_NE(what.find("float64"), std::string::npos) << what;
  }
}

struct TwiceImpl : torch::nn::Module {
  TwiceImpl() : fc(register_module("fc", torch::nn::Linear(3, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return ddp::nn::call(fc, ddp::nn::call(fc, x));
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(Twice);

TEST(FullyShard, AUnitCalledTwiceInOneForwardIsRefusedByName) {
  Twice net;
  ddp::FullyShardedDataParallel model(net.ptr(), {net->fc.ptr()}, local_group());
  try {
    model.forward_with([&] { return net->forward(torch::ones({1, 3})); });
    FAIL() << "a unit ran twice in one forward";
  } catch (const ddp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unit fc is called twice"), std::string::npos) << e.what();
  }
  // Nothing stays gathered after the failed forward.
  EXPECT_EQ(model.resident_parameter_bytes(), model.parameters()[0].nbytes());
}

TEST(FullyShard, OutsideTheWrapperAUnitCallIsThePlainCall) {
  Twice net;
  const auto x = torch::ones({1, 3});
  EXPECT_TRUE(net->forward(x).equal(net->fc(net->fc(x))));
}

TEST(FullyShard, AUnitThatIsNotInTheModelIsRefused) {
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  torch::nn::Linear stranger(2, 2);
  EXPECT_THROW(ddp::FullyShardedDataParallel(net.ptr(), {stranger.ptr()}, local_group()),
               ddp::InputError);
}

}  // namespace
