// The sharded model's pure layout function and what it refuses, on one process (the local
// backend); the training itself with real ranks is tests/integration/test_fsdp.cpp's.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "adapted_net.h"
#include "ddp/comm/rendezvous.h"
#include "ddp/core/fully_shard.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/sharded_checkpoint.h"
#include "ddp/train/sharded_weights.h"
#include "forwarding_group.h"
#include "subprocess.h"

namespace {

using ddp::fsdp::plan_flat_layout;
using ddp::testing::AdaptedNet;
using ddp::testing::copy_parameters;
using ddp::testing::trainable_gradients;

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

// Note [Units unused on some ranks]: the next forward's order from the earliest place any rank
// called each unit at.
TEST(NextGatherOrder, UnitsByTheirEarliestPlaceTiesAndTheUncalledInThePreviousOrder) {
  // Rank 0 called units 0, 2, 3 (places 1-3); rank 1 units 0, 1, 3: unit 1 at its place 2 ties
  // with unit 2; unit 4 nobody called.
  EXPECT_EQ(ddp::fsdp::next_gather_order({1, 2, 2, 3, 0}, {0, 1, 2, 3, 4}),
            (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ddp::fsdp::next_gather_order({1, 2, 2, 3, 0}, {4, 2, 3, 1, 0}),
            (std::vector<size_t>{0, 2, 1, 3, 4}));
  // A model calling its units in another order than it listed them.
  EXPECT_EQ(ddp::fsdp::next_gather_order({3, 1, 0, 2}, {0, 1, 2, 3}),
            (std::vector<size_t>{1, 3, 0, 2}));
}

TEST(FlatLayout, MoreRanksThanElementsGiveEachAtMostOne) {
  const auto layout = plan_flat_layout({1, 2}, 8);
  EXPECT_EQ(layout.shard, 1);
  EXPECT_EQ(layout.padded, 8);
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
  torch::Tensor forward(const torch::Tensor& x) { return ddp::nn::call(fc, ddp::nn::call(fc, x)); }
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

// Its state is saved per shard: an optimizer over anything else would be saved without it.
TEST(ShardedCheckpoint, AnOptimizerThatDoesNotStepTheShardsIsRefused) {
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  ddp::FullyShardedDataParallel model(net, local_group());
  const ddp::train::OptimizerFactory make = [](const std::vector<torch::Tensor>& params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  };
  std::vector<torch::Tensor> views;
  for (const auto& [name, view] : model.named_parameters()) views.push_back(view);
  for (const auto& params : {views, std::vector<torch::Tensor>{}}) {
    auto optimizer = make(params);
    EXPECT_THROW(ddp::train::ShardedCheckpoint(model, *optimizer, make, local_group()),
                 ddp::InputError);
  }
  auto optimizer = make(model.parameters());
  EXPECT_NO_THROW(ddp::train::ShardedCheckpoint(model, *optimizer, make, local_group()));
}

TEST(FullyShard, AUnitThatIsNotInTheModelIsRefused) {
  torch::nn::Sequential net(torch::nn::Linear(3, 2));
  torch::nn::Linear stranger(2, 2);
  EXPECT_THROW(ddp::FullyShardedDataParallel(net.ptr(), {stranger.ptr()}, local_group()),
               ddp::InputError);
}

// bf16 compute from float32 shards, on one rank: the forward is a bf16 copy of the model's on
// inputs cast to bf16, the shards' gradients that copy's cast to float32 (one rank: the average
// is the gradient itself).
TEST(FullyShard, MixedPrecisionComputesInParamDtypeFromFloat32Shards) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  copy->to(torch::kBFloat16);
  ddp::FullyShardedDataParallel model(
      net, local_group(),
      ddp::FullyShardOptions().mp_policy(
          ddp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16).output_dtype(torch::kFloat32)));
  const auto x = torch::randn({5, 4});
  const auto out = model.forward(x);
  const auto expected = copy->forward(x.to(torch::kBFloat16)).to(torch::kFloat32);
  ASSERT_EQ(out.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(out.equal(expected));
  out.square().sum().backward();
  expected.square().sum().backward();
  const auto shards = model.parameters();
  ASSERT_EQ(shards.size(), 2u);
  for (size_t unit = 0; unit < 2; ++unit) {
    const auto& layer = *copy->ptr(unit == 0 ? 0 : 2)->as<torch::nn::Linear>();
    const auto grads = torch::cat({layer.weight.grad().reshape(-1), layer.bias.grad()});
    EXPECT_EQ(shards[unit].scalar_type(), torch::kFloat32);
    ASSERT_EQ(shards[unit].grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(shards[unit].grad().equal(grads.to(torch::kFloat32))) << "unit " << unit;
  }
}

TEST(FullyShard, ABatchNormUnderABfloat16PolicyIsRefusedByName) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  try {
    ddp::FullyShardedDataParallel model(
        net, local_group(),
        ddp::FullyShardOptions().mp_policy(
            ddp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16)));
    FAIL() << "a BatchNorm was given bf16 weights beside float32 statistics";
  } catch (const ddp::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("1 (torch::nn::BatchNorm1d"), std::string::npos) << what;
    EXPECT_NE(what.find("keeps its running_mean in float32"), std::string::npos) << what;
  }
}

// A module whose parameters are all in the root unit gets its inputs cast by forward_with.
TEST(FullyShard, ForwardWithCastsItsInputsToTheParamDtype) {
  torch::nn::Linear net(3, 2);
  ddp::FullyShardedDataParallel model(
      net.ptr(), {}, local_group(),
      ddp::FullyShardOptions().mp_policy(
          ddp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16)));
  const auto out = model.forward_with([&](const torch::Tensor& x) { return net->forward(x); },
                                      torch::ones({1, 3}));
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);  // no output_dtype: as computed
}

}  // namespace

// A block whose forward calls its unit `fc` through ddp::nn::call, or (`direct`) as users forget
// to: fc(x).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(bool direct)
      : fc(register_module("fc", torch::nn::Linear(3, 3))),
        head(register_module("head", torch::nn::Linear(3, 1))),
        direct(direct) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return head(direct ? fc(x) : ddp::nn::call(fc, x));
  }
  torch::nn::Linear fc, head;
  bool direct;
};
TORCH_MODULE(Block);

std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FullyShard, AUnitCalledWithoutCallIsRefusedNamingItAndTheCall) {
  Block net(/*direct=*/true);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->fc.ptr()}, local_group());
  for (int step = 0; step < 2; ++step) {  // the first forward (prefetch predicts fc) and a later
    const std::string what = error_of([&] {
      model.forward_with([&] { return net->forward(torch::ones({2, 3})); });
    });
    EXPECT_NE(what.find("parameters that hold no data"), std::string::npos) << what;
    EXPECT_NE(what.find("ddp::nn::call(unit, ...)"), std::string::npos) << what;
    EXPECT_NE(what.find("this forward so far: fc"), std::string::npos) << what;
  }
  EXPECT_EQ(model.resident_parameter_bytes(),
            model.parameters()[0].nbytes() + model.parameters()[1].nbytes());
}

TEST(FullyShard, ALibTorchErrorInAUnitsForwardNamesTheUnit) {
  Block net(/*direct=*/false);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->fc.ptr()}, local_group());
  const std::string what = error_of([&] {
    model.forward_with([&] { return net->forward(torch::ones({2, 5})); });
  });
  EXPECT_NE(what.find("the forward of unit fc failed: "), std::string::npos) << what;
  EXPECT_EQ(what.find("hold no data"), std::string::npos) << what;
}

// An op whose backward fails, as a LibTorch error inside a unit's backward.
struct FailsInBackward : torch::autograd::Function<FailsInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 const torch::autograd::variable_list&) {
    TORCH_CHECK(false, "the op's own backward error");
  }
};

struct FailingBlockImpl : torch::nn::Module {
  FailingBlockImpl() : fc(register_module("fc", torch::nn::Linear(3, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return FailsInBackward::apply(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(FailingBlock);

TEST(FullyShard, ALibTorchErrorInAUnitsBackwardNamesTheUnit) {
  torch::nn::Sequential net(torch::nn::Linear(3, 3), FailingBlock(), torch::nn::Linear(3, 1));
  ddp::FullyShardedDataParallel model(net, local_group());
  const auto loss = model.forward(torch::ones({2, 3})).sum();
  const std::string what = error_of([&] { model.backward(loss); });
  EXPECT_NE(what.find("fully_shard: the backward of unit 1 failed: "), std::string::npos) << what;
  EXPECT_NE(what.find("the op's own backward error"), std::string::npos) << what;
  EXPECT_NE(what.find("ddp::nn::call(unit, ...)"), std::string::npos) << what;
}

// Between steps the parameters' values are not there (each rank holds a shard): reading them
// throws, naming the parameter where the LibTorch release lets the error say so; their shapes
// stay readable, and state_dict() gives the values.
TEST(FullyShard, ParametersBetweenStepsThrowWhenReadNeverCrash) {
  Block net(/*direct=*/false);
  torch::manual_seed(3);
  const auto before = net->fc->weight.detach().clone();
  ddp::FullyShardedDataParallel model(net.ptr(), {net->fc.ptr()}, local_group());
  auto out = model.forward_with([&] { return net->forward(torch::ones({2, 3})); });
  out.sum().backward();
  const auto& weight = net->fc->weight;
  EXPECT_EQ(weight.sizes(), before.sizes());
  const std::string norm = error_of([&] { (void)weight.norm().item<float>(); });
  EXPECT_NE(norm, "(no error)");
  const std::string print = error_of([&] {
    std::ostringstream text;
    text << weight;
  });
  EXPECT_NE(print, "(no error)");
  std::ostringstream file;
  EXPECT_NE(error_of([&] { torch::save(net, file); }), "(no error)");
  EXPECT_NE(error_of([&] { (void)net->forward(torch::ones({2, 3})); }), "(no error)");
// A tensor's own message for a read without storage: in 2.6 (the release tested), not in 1.13.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  EXPECT_NE(norm.find("parameter fc.weight of unit fc holds no data"), std::string::npos) << norm;
#endif
  const auto state = model.state_dict();
  EXPECT_EQ(state[0].first, "fc.weight");
  EXPECT_TRUE(state[0].second.equal(before));
}

TEST(FullyShard, ReadsOfParametersWithoutDataAreToldFromOtherErrors) {
  using ddp::fsdp::reads_parameters_without_data;
  EXPECT_TRUE(reads_parameters_without_data(
      "Cannot access data pointer of Tensor that doesn't have storage"));
  EXPECT_TRUE(reads_parameters_without_data("Cannot access storage of TensorImpl"));
  EXPECT_TRUE(reads_parameters_without_data(
      "fully_shard: parameter a of unit b holds no data while the unit is not gathered: ..."));
  EXPECT_FALSE(reads_parameters_without_data("mat1 and mat2 shapes cannot be multiplied"));
}

// A projection that uses another module's weight as its own (registered under its own name), as
// a language model's head shares its embedding's.
struct ProjImpl : torch::nn::Module {
  explicit ProjImpl(const torch::Tensor& shared) : weight(register_parameter("weight", shared)) {}
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(Proj);

struct TiedBlockImpl : torch::nn::Module {
  TiedBlockImpl()
      : lin(register_module("lin", torch::nn::Linear(3, 3))),
        proj(register_module("proj", Proj(lin->weight))) {}
  torch::Tensor forward(const torch::Tensor& x) { return proj(torch::tanh(lin(x))); }
  torch::nn::Linear lin;
  Proj proj;
};
TORCH_MODULE(TiedBlock);

// `block` a unit whose two modules share a weight; `out` ties to the block's weight (when
// `tie_out`) or has its own.
struct TiedNetImpl : torch::nn::Module {
  explicit TiedNetImpl(bool tie_out)
      : block(register_module("block", TiedBlock())),
        out(register_module("out", Proj(tie_out ? block->lin->weight : torch::randn({3, 3})))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(ddp::nn::call(block, x)); }
  TiedBlock block;
  Proj out;
};
TORCH_MODULE(TiedNet);

TEST(FullyShard, AWeightTiedInsideAUnitIsShardedOnceAndSavedUnderBothNames) {
  torch::manual_seed(4);
  TiedNet reference(/*tie_out=*/false);
  TiedNet net(/*tie_out=*/false);
  copy_parameters(*reference, *net);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->block.ptr()}, local_group());
  EXPECT_EQ(model.parameters()[0].numel(), 9 + 3);  // lin.weight (= proj.weight) and lin.bias
  const auto x = torch::randn({4, 3});
  model.forward_with([&] { return net->forward(x); }).pow(2).sum().backward();
  reference->forward(x).pow(2).sum().backward();
  const auto& lin = reference->block->lin;
  EXPECT_TRUE(model.parameters()[0].grad().allclose(
      torch::cat({lin->weight.grad().reshape(-1), lin->bias.grad()}), 1e-6, 1e-6));
  std::map<std::string, torch::Tensor> state;
  for (const auto& [name, value] : model.state_dict()) state[name] = value;
  EXPECT_TRUE(state.at("block.proj.weight").equal(lin->weight));
  EXPECT_TRUE(state.at("block.lin.weight").equal(lin->weight));

  // The same weights written a unit at a time: nn.DataParallel's keys, the tied pair one tensor.
  ddp::testing::TempDir dir;
  ddp::train::save_weights(model, dir.file("model.pt"), /*write=*/true);
  const auto saved = ddp::train::read_pt_file(dir.file("model.pt")).toGenericDict();
  EXPECT_EQ(saved.size(), state.size());
  for (const auto& [name, value] : state) {
    EXPECT_TRUE(saved.at("module." + name).toTensor().equal(value)) << name;
  }
  EXPECT_EQ(saved.at("module.block.proj.weight").toTensor().data_ptr(),
            saved.at("module.block.lin.weight").toTensor().data_ptr());
}

TEST(FullyShard, AWeightTiedBetweenAUnitAndTheRestIsRefusedNamingBoth) {
  TiedNet net(/*tie_out=*/true);
  const std::string what = error_of(
      [&] { ddp::FullyShardedDataParallel(net.ptr(), {net->block.ptr()}, local_group()); });
  EXPECT_NE(what.find("out.weight (unit (root)) is the same tensor as block.lin.weight (unit "
                      "block)"),
            std::string::npos)
      << what;
}

TEST(FullyShard, AWeightTiedBetweenTwoUnitsIsRefusedNamingBoth) {
  TiedNet net(/*tie_out=*/true);
  const std::string what = error_of([&] {
    ddp::FullyShardedDataParallel(net.ptr(), {net->block.ptr(), net->out.ptr()}, local_group());
  });
  EXPECT_NE(what.find("out.weight (unit out) is the same tensor as block.lin.weight (unit block)"),
            std::string::npos)
      << what;
}

TEST(FullyShard, AWeightTiedInsideTheRootIsShardedOnce) {
  TiedNet net(/*tie_out=*/true);
  ddp::FullyShardedDataParallel model(net.ptr(), {}, local_group());
  ASSERT_EQ(model.num_units(), 1);
  EXPECT_EQ(model.parameters()[0].numel(), 9 + 3);
  std::map<std::string, torch::Tensor> state;
  for (const auto& [name, value] : model.state_dict()) state[name] = value;
  EXPECT_EQ(state.size(), 4u);  // block.lin.weight, block.lin.bias, block.proj.weight, out.weight
  EXPECT_TRUE(state.at("out.weight").equal(state.at("block.lin.weight")));
}

TEST(FullyShard, NestedUnitsAreRefused) {
  TiedNet net(/*tie_out=*/false);
  const std::string what = error_of([&] {
    ddp::FullyShardedDataParallel(net.ptr(), {net->block.ptr(), net->block->lin.ptr()},
                                  local_group());
  });
  EXPECT_NE(what.find("parameter block.lin.weight belongs to units block and block.lin"),
            std::string::npos)
      << what;
}

// Units whose forward returns several tensors: LibTorch's LSTM (a tensor and a tuple of two) and
// a struct of the user's. Whichever output the loss reaches first, the unit is gathered for its
// backward, and the shards' gradients are the unwrapped model's (one rank: the average is the
// gradient itself).
struct Pair {
  torch::Tensor y, aux;
};
std::vector<torch::Tensor*> ddp_output_tensors(Pair& out) {
  return {&out.y, &out.aux};
}

struct TwoOutImpl : torch::nn::Module {
  TwoOutImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  Pair forward(const torch::Tensor& x) {
    auto y = fc(x);
    return {y, torch::sigmoid(y) * fc->weight.sum()};
  }
  torch::nn::Linear fc;
};
TORCH_MODULE(TwoOut);

struct RecurrentImpl : torch::nn::Module {
  RecurrentImpl()
      : lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(4, 4)))),
        two(register_module("two", TwoOut())) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto [out, state] = ddp::nn::call(lstm, x);
    auto pair = ddp::nn::call(two, out);
    return pair.y.sum() + 2 * pair.aux.sum() + 3 * std::get<1>(state).pow(2).sum();
  }
  torch::nn::LSTM lstm;
  TwoOut two;
};
TORCH_MODULE(Recurrent);

TEST(FullyShard, UnitsMayReturnTuplesAndStructs) {
  torch::manual_seed(6);
  Recurrent reference, net;
  copy_parameters(*reference, *net);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->lstm.ptr(), net->two.ptr()}, local_group());
  const auto x = torch::randn({3, 2, 4});
  model.forward_with([&] { return net->forward(x); }).backward();
  reference->forward(x).backward();
  const auto shards = model.parameters();
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_TRUE(shards[0].grad().allclose(trainable_gradients(*reference->lstm), 1e-6, 1e-6));
  EXPECT_TRUE(shards[1].grad().allclose(trainable_gradients(*reference->two), 1e-6, 1e-6));
}

// Frozen bases with trainable low-rank adapters (LoRA's shape: adapted_net.h): a frozen weight is
// gathered with its unit but never reduced nor given a gradient; a unit with nothing trainable
// (the stem) keeps a shard that does not require grad. Trained three SGD steps, the model equals
// the unwrapped one (one rank).

TEST(FullyShard, AFrozenBaseWithTrainableAdaptersTrainsAsTheUnwrappedModel) {
  torch::manual_seed(8);
  AdaptedNet reference(6, 2, 3), net(6, 2, 3);
  copy_parameters(*reference, *net);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->stem.ptr(), net->a.ptr(), net->b.ptr()},
                                      local_group());
  const auto shards = model.parameters();
  ASSERT_EQ(shards.size(), 4u);  // stem, a, b, the root (head)
  EXPECT_FALSE(shards[0].requires_grad());
  EXPECT_EQ(shards[1].numel(), 2 * 6 + 6 * 2);  // a's adapter only: its base is apart
  torch::optim::SGD opt(shards, torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto trainable = ddp::testing::trainable_parameters(*reference);
  torch::optim::SGD reference_opt(trainable, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, 6});
    opt.zero_grad();
    model.forward_with([&] { return net->forward(x); }).pow(2).mean().backward();
    opt.step();
    reference_opt.zero_grad();
    reference->forward(x).pow(2).mean().backward();
    reference_opt.step();
  }
  EXPECT_FALSE(shards[0].grad().defined());
  for (const auto& [name, value] : model.state_dict()) {
    const auto want = reference->named_parameters()[name];
    EXPECT_TRUE(value.allclose(want, 1e-5, 1e-6)) << name;
  }
  // Nothing of a frozen parameter is held between steps but its shard.
  int64_t shard_bytes = 0;
  for (const auto& shard : shards) shard_bytes += shard.nbytes();
  EXPECT_EQ(model.resident_parameter_bytes(), shard_bytes + 2 * (6 * 6 + 6) * 4);  // a's, b's bases
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

// Gradient accumulation as FSDP2's: the micro-batches before the last keep their gradients whole
// (set_requires_gradient_sync(false)), the last reduce-scatters them with its own: one
// reduce-scatter per unit per optimizer step, as without accumulation, and the shards' gradients
// the sum of the micro-batches' (one rank: the average is the sum itself).
TEST(FullyShard, MicroBatchesWithoutSyncReduceOncePerStepTheirSum) {
  torch::manual_seed(9);
  AdaptedNet reference(6, 2, 3), net(6, 2, 3);
  copy_parameters(*reference, *net);
  auto group = local_group();
  ddp::FullyShardedDataParallel model(net.ptr(), {net->a.ptr(), net->b.ptr()}, group);
  const uint64_t before = group->last_seq();
  for (int micro = 0; micro < 3; ++micro) {
    const auto x = torch::randn({4, 6});
    model.set_requires_gradient_sync(micro == 2);
    model.forward_with([&] { return net->forward(x); }).pow(2).mean().backward();
    reference->forward(x).pow(2).mean().backward();
  }
  int reduce_scatters = 0;
  for (const auto& record : group->recorder().records()) {
    if (record.seq > before && record.op.rfind("reduce_scatter", 0) == 0) ++reduce_scatters;
  }
  EXPECT_EQ(reduce_scatters, model.num_units());  // a, b and the root (stem and head), once
  const auto shards = model.parameters();
  EXPECT_TRUE(shards[0].grad().allclose(trainable_gradients(*reference->a), 1e-5, 1e-6));
  EXPECT_TRUE(shards[1].grad().allclose(trainable_gradients(*reference->b), 1e-5, 1e-6));
  EXPECT_TRUE(shards[2].grad().allclose(trainable_gradients(*reference->head), 1e-5, 1e-6));
}

// The options, each against its default: a test that fails when the option is ignored.
int collectives_since(const ddp::comm::ProcessGroup& group, uint64_t after, const char* op) {
  int count = 0;
  for (const auto& record : group.recorder().records()) {
    if (record.seq > after && record.op.rfind(op, 0) == 0) ++count;
  }
  return count;
}

TEST(FullyShardOptions, WithoutReshardAfterForwardEachUnitIsGatheredOncePerStep) {
  for (const bool reshard : {true, false}) {
    torch::manual_seed(2);
    AdaptedNet net(6, 2, 3);
    auto group = local_group();
    ddp::FullyShardedDataParallel model(net.ptr(), {net->a.ptr(), net->b.ptr()}, group,
                                        ddp::FullyShardOptions().reshard_after_forward(reshard));
    const uint64_t before = group->last_seq();
    auto out = model.forward_with([&] { return net->forward(torch::randn({4, 6})); });
    // Between the forward and the backward: a and b kept whole, or given back (the root unit is
    // kept either way).
    const int64_t whole_ab = 2 * (2 * (6 * 2) + (6 * 6 + 6)) * 4;  // adapters and bases
    const int64_t held = model.resident_parameter_bytes();
    out.sum().backward();
    const int64_t after_step = model.resident_parameter_bytes();
    EXPECT_EQ(held - after_step, (reshard ? 0 : whole_ab) + (6 * 6 + 6 + 6 * 3 + 3) * 4)
        << "reshard_after_forward " << reshard;
    // a and b: gathered in the forward and again in the backward, or once; the root once.
    EXPECT_EQ(collectives_since(*group, before, "all_gather"), reshard ? 2 * 2 * 2 + 2 : 2 * 2 + 2)
        << "reshard_after_forward " << reshard;
  }
}

TEST(FullyShardOptions, WithoutInitSyncNothingIsBroadcast) {
  for (const bool sync : {true, false}) {
    torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4),
                              torch::nn::Linear(4, 2));
    auto group = local_group();
    const uint64_t before = group->last_seq();
    ddp::FullyShardedDataParallel model(net, group, ddp::FullyShardOptions().init_sync(sync));
    // Each unit's parameters (Linear, BatchNorm, Linear); at world size 1 the buffers have
    // nothing to be sent (fsdp_worker's versus-ddp counts theirs at 2 and 3 ranks).
    EXPECT_EQ(collectives_since(*group, before, "broadcast"), sync ? 3 : 0) << "init_sync " << sync;
  }
}

// A unit that says which dtype its input came in.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() : fc(register_module("fc", torch::nn::Linear(3, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    seen = x.scalar_type();
    return fc(x.to(fc->weight.scalar_type()));
  }
  torch::nn::Linear fc;
  c10::ScalarType seen = c10::ScalarType::Undefined;
};
TORCH_MODULE(Probe);

TEST(FullyShardOptions, WithoutCastForwardInputsAUnitGetsItsInputAsItIs) {
  for (const bool cast : {true, false}) {
    torch::nn::Sequential net{Probe()};
    ddp::FullyShardedDataParallel model(
        net, local_group(),
        ddp::FullyShardOptions().mp_policy(
            ddp::MixedPrecisionPolicy().param_dtype(torch::kBFloat16).cast_forward_inputs(cast)));
    model.forward(torch::ones({1, 3}));
    EXPECT_EQ(net[0]->as<ProbeImpl>()->seen, cast ? torch::kBFloat16 : torch::kFloat32)
        << "cast_forward_inputs " << cast;
  }
}

// Clipping over the shards is torch.nn.utils.clip_grad_norm_ on the unwrapped model (one rank:
// the shard is the whole unit, padded with zeros).
TEST(FullyShard, ClippingOverTheShardsIsClippingTheWholeModel) {
  torch::manual_seed(10);
  AdaptedNet reference(6, 2, 3), net(6, 2, 3);
  copy_parameters(*reference, *net);
  ddp::FullyShardedDataParallel model(net.ptr(), {net->a.ptr(), net->b.ptr()}, local_group());
  const auto x = torch::randn({4, 6});
  model.forward_with([&] { return net->forward(x); }).pow(2).sum().backward();
  reference->forward(x).pow(2).sum().backward();
  const auto trainable = ddp::testing::trainable_parameters(*reference);
  const double want = torch::nn::utils::clip_grad_norm_(trainable, 0.1);
  EXPECT_NEAR(model.clip_grad_norm(0.1), want, 1e-6 * want);
  const auto shards = model.parameters();
  EXPECT_TRUE(shards[0].grad().allclose(trainable_gradients(*reference->a), 1e-5, 1e-7));
  EXPECT_TRUE(shards[2].grad().allclose(trainable_gradients(*reference->head), 1e-5, 1e-7));
}

// The local group, recording the buffers it made (allocate_buffer) and the memory its
// all-gathers wrote and its reduce-scatters read and wrote.
class BufferRecordingGroup : public ddp::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  // Where a tensor's bytes were when a collective was given it (a unit's gathered buffer points
  // at other memory, or none, later).
  struct Place {
    const uint8_t* begin;
    size_t bytes;
  };
  static Place place_of(const at::Tensor& t) {
    return {static_cast<const uint8_t*>(t.data_ptr()), t.nbytes()};
  }
  // Whether `place` lies inside one of the buffers made.
  bool in_buffers(const Place& place) const {
    return std::any_of(buffers_.begin(), buffers_.end(), [&](const at::Tensor& b) {
      const auto* base = static_cast<const uint8_t*>(b.data_ptr());
      return place.begin >= base && place.begin + place.bytes <= base + b.nbytes();
    });
  }
  std::vector<at::Tensor> buffers_;
  std::vector<Place> gathered_, reduced_;

 protected:
  at::Tensor do_allocate_buffer(int64_t numel, const at::TensorOptions& options) override {
    buffers_.push_back(inner_->allocate_buffer(numel, options));
    return buffers_.back();
  }
  WorkPtr do_all_gather(at::Tensor& out, const at::Tensor& in, const Info&) override {
    gathered_.push_back(place_of(out));
    return inner_->all_gather(out, in);
  }
  WorkPtr do_reduce_scatter(at::Tensor& out, const at::Tensor& in, Op op, const Info&) override {
    reduced_.push_back(place_of(in));
    reduced_.push_back(place_of(out));
    return inner_->reduce_scatter(out, in, op);
  }
};

// Two losses of one forward, each given its own backward (retain_graph for the first), add up their
// gradients as in the unsharded model: the second backward gathers and reduces the units again.
TEST(FullyShard, TwoBackwardsThroughOneForwardAddUpTheirGradients) {
  torch::manual_seed(5);
  torch::nn::Sequential reference(torch::nn::Linear(6, 6), torch::nn::Linear(6, 3));
  for (const bool reshard : {true, false}) {
    // A model of its own each time: a sharded model leaves its module's parameters without data.
    torch::nn::Sequential net(torch::nn::Linear(6, 6), torch::nn::Linear(6, 3));
    copy_parameters(*reference, *net);
    ddp::FullyShardedDataParallel model(net, local_group(),
                                        ddp::FullyShardOptions().reshard_after_forward(reshard));
    const auto x = torch::randn({4, 6});
    const auto out = model.forward(x);
    out.pow(2).mean().backward({}, /*retain_graph=*/true);
    out.sum().backward();
    const auto want = reference->forward(x);
    want.pow(2).mean().backward({}, /*retain_graph=*/true);
    want.sum().backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : reference->parameters()) grads.push_back(p.grad().reshape(-1));
    const auto shards = model.parameters();
    EXPECT_TRUE(shards[0].grad().allclose(torch::cat({grads[0], grads[1]}), 1e-5, 1e-6));
    EXPECT_TRUE(shards[1].grad().allclose(torch::cat({grads[2], grads[3]}), 1e-5, 1e-6));
    for (auto& p : reference->parameters()) p.mutable_grad() = torch::Tensor();
  }
}

TEST(FullyShard, UnitsGatherAndReduceInBuffersTheGroupMadeOnce) {
  torch::manual_seed(11);
  torch::nn::Sequential reference(torch::nn::Linear(16, 16), torch::nn::Linear(16, 16),
                                  torch::nn::Linear(16, 16));
  torch::nn::Sequential net(torch::nn::Linear(16, 16), torch::nn::Linear(16, 16),
                            torch::nn::Linear(16, 16));
  copy_parameters(*reference, *net);
  auto group = std::make_shared<BufferRecordingGroup>(local_group());
  ddp::FullyShardedDataParallel model(net, group);
  // Two units gathered at a time (prefetch) and the reduce-scatter's output.
  ASSERT_EQ(group->buffers_.size(), 3u);
  torch::optim::SGD optimizer(model.parameters(), 0.1), expected(reference->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, 16});
    model.forward(x).pow(2).sum().backward();
    optimizer.step();
    optimizer.zero_grad();
    reference->forward(x).pow(2).sum().backward();
    expected.step();
    expected.zero_grad();
  }
  EXPECT_EQ(group->buffers_.size(), 3u) << "the buffers are made once, at construction";
  ASSERT_EQ(group->gathered_.size(), 3u * 2 * 3);  // each unit in forward and backward, 3 steps
  ASSERT_EQ(group->reduced_.size(), 3u * 2 * 3);
  for (const auto& place : group->gathered_) EXPECT_TRUE(group->in_buffers(place));
  for (const auto& place : group->reduced_) EXPECT_TRUE(group->in_buffers(place));
  const auto state = model.state_dict();
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_TRUE(state[i].second.allclose(reference->named_parameters()[state[i].first], 1e-5, 1e-6))
        << state[i].first;
  }
}
