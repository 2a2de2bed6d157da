// One rank of the fully sharded tests (test_fsdp.cpp). Each scenario trains a model sharded over
// the ranks of a real process group and the same model another way, from the same seed, and
// exits 0 only if their states agree after every step:
//   sequential   a Sequential MLP (its Linear layers the units) on N ranks against one process
//                with the N-times batch, Adam, with an evaluation forward between steps
//   custom       a model with its own forward (embedding and head in the root unit, three blocks
//                called through ddp::nn::call) against one process, SGD with momentum, and two
//                micro-batches per step
//   overlap      the custom model's steps: each block's all-gather issued before the previous
//                block's forward, or the next block's backward, ended, and in some steps still in
//                flight (the flight record's issue and arrival on gloo's thread) while that block
//                computed; without prefetch, none of that
//   versus-ddp   a Sequential with BatchNorm (in the root unit) and a nested Sequential (whose
//                Linear is a unit) against DistributedDataParallel on the same ranks
//                (broadcast_buffers off: each rank its own statistics, in both); its
//                construction broadcasts each unit once and the buffers once per dtype
//   adapters     frozen Linear bases with trainable low-rank adapters (LoRA's shape), a wholly
//                frozen unit, against DistributedDataParallel: equal, and no frozen parameter
//                given a gradient
//   param-groups the MLP's per-parameter views of the shards (named_parameters) in two AdamW
//                groups (weight decay on the weights, none on the biases) against DDP with the
//                same groups
//   hybrid       hybrid sharding (FullyShardOptions::replicate_group) on 4 ranks as 2 hosts of 2,
//                against DDP: equal, each rank holding half the parameters, the bytes all-reduced
//                across hosts half those DDP all-reduces
//   unused       units some ranks do not use in a step, against DDP with find_unused_parameters:
//                a branch taken on some ranks, a side output left out of the loss on some (given
//                to backward(loss)), a unit no rank calls after the first step
//   checkpoints  the library's checkpoints (ShardedCheckpoint) of the adapted net (its frozen
//                bases too) and its Adam, as a program of its own saves them: each rank's file
//                written in the background while the next step trains, the same written at
//                once (save), and one gathered file;
//                each loaded on as many ranks and on two of them (a new_group) into a model of
//                other values, one more step equal to the run that went on
// Each but param-groups also checks the shards' sizes (1/N of each unit, padded) and that nothing
// stays gathered after a step.
//   fsdp_worker BACKEND SCENARIO [DIR (checkpoints: where its files go)]
#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "adapted_net.h"
#include "ddp/comm/hierarchical.h"
#include "ddp/common/error.h"
#include "ddp/core/distributed_data_parallel.h"
#include "ddp/core/fully_shard.h"
#include "ddp/train/sharded_checkpoint.h"
#include "forwarding_group.h"
#include "worker_group.h"

namespace fsdp_worker {

namespace {

int g_failures = 0;
constexpr double kTolerance = 1e-5;
constexpr int64_t kBatchPerRank = 4;
constexpr int kSteps = 3;

void expect(bool ok, const std::string& what) {
  if (!ok) ++g_failures;
  std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
}

using Group = std::shared_ptr<ddp::comm::ProcessGroup>;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The module's parameters and buffers in Python's state_dict order: each module's parameters,
// then its buffers, then its children's.
NamedTensors state_of(torch::nn::Module& module, const std::string& prefix = "") {
  NamedTensors state;
  for (const auto& item : module.named_parameters(false)) {
    state.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& item : module.named_buffers(false)) {
    state.emplace_back(prefix + item.key(), item.value());
  }
  for (const auto& child : module.named_children()) {
    for (auto& entry : state_of(*child.value(), prefix + child.key() + ".")) {
      state.push_back(std::move(entry));
    }
  }
  return state;
}

// Every tensor of `got` within kTolerance of `want`'s, with the same names in the same order.
void expect_states_equal(const NamedTensors& got, const NamedTensors& want,
                         const std::string& what) {
  bool same = got.size() == want.size();
  double worst = 0;
  for (size_t i = 0; same && i < got.size(); ++i) {
    same = got[i].first == want[i].first && got[i].second.sizes() == want[i].second.sizes();
    if (same) {
      const auto diff =
          (got[i].second.detach().to(torch::kDouble) - want[i].second.detach().to(torch::kDouble))
              .abs();
      worst = std::max(worst, diff.numel() == 0 ? 0.0 : diff.max().item<double>());
    }
  }
  expect(same && worst <= kTolerance, fmt::format("{}: max |difference| {:.3g}", what, worst));
}

struct Batch {
  torch::Tensor x, y;
};

// Step `step`'s global batch, the same on every rank; rank r trains rows [r*4, r*4+4).
Batch global_batch(int step, int world, int64_t features) {
  torch::manual_seed(1000 + step);
  const int64_t rows = kBatchPerRank * world;
  return {torch::randn({rows, features}), torch::randint(0, 5, {rows})};
}

torch::Tensor rows_of(const torch::Tensor& t, const Group& g) {
  return t.narrow(0, g->rank() * kBatchPerRank, kBatchPerRank);
}

void expect_sharded(ddp::FullyShardedDataParallel& model, const Group& g,
                    const std::vector<int64_t>& unit_numels) {
  const auto shards = model.parameters();
  bool sizes = shards.size() == unit_numels.size();
  int64_t bytes = 0;
  for (size_t i = 0; sizes && i < shards.size(); ++i) {
    const int64_t world = g->world_size();
    sizes = shards[i].numel() == (unit_numels[i] + world - 1) / world;
    bytes += shards[i].numel() * static_cast<int64_t>(shards[i].element_size());
  }
  expect(sizes, "each unit's shard holds 1/N of it (padded)");
  expect(model.resident_parameter_bytes() == bytes,
         fmt::format("nothing gathered between steps: {} bytes resident, {} in shards",
                     model.resident_parameter_bytes(), bytes));
}

torch::nn::Sequential make_mlp() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(12, 24), torch::nn::ReLU(),
                               torch::nn::Linear(24, 16), torch::nn::ReLU(),
                               torch::nn::Linear(16, 5));
}

void sequential(const Group& g) {
  auto reference = make_mlp();
  torch::optim::Adam reference_opt(reference->parameters(), torch::optim::AdamOptions(1e-2));
  auto net = make_mlp();
  ddp::FullyShardedDataParallel model(net, g);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-2));
  expect(model.num_units() == 3, "the three Linear layers are the units");
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    const torch::Tensor& x = batch.x;
    const torch::Tensor& y = batch.y;
    reference_opt.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
    reference_opt.step();
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(rows_of(x, g)), rows_of(y, g)).backward();
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*reference),
                        fmt::format("step {}: sharded == one process with the whole batch", step));
    torch::NoGradGuard no_grad;
    const auto got = model.forward(x);
    expect((got - reference->forward(x)).abs().max().item<double>() <= kTolerance,
           fmt::format("step {}: an evaluation forward equals the reference's", step));
  }
  expect_sharded(model, g, {12 * 24 + 24, 24 * 16 + 16, 16 * 5 + 5});
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// When each block's forward and backward began and ended (the overlap scenario's; null: not
// recorded), by name: "forward begin 1", "backward end 2", ...
std::map<std::string, double>* g_events = nullptr;

// How long a block computes in the overlap scenario, each pass (a sleep standing for the work).
constexpr auto kBlockCompute = std::chrono::milliseconds(3);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, int index)
      : fc(register_module("fc", torch::nn::Linear(width, width))), index(index) {}
  torch::Tensor forward(torch::Tensor x) {
    if (g_events == nullptr) return x + torch::tanh(fc(x));
    (*g_events)[fmt::format("forward begin {}", index)] = now();
    if (x.requires_grad()) {  // its gradient is the block's backward's last result
      x = x.view_as(x);
      x.register_hook([this](const torch::Tensor&) {
        std::this_thread::sleep_for(kBlockCompute);
        (*g_events)[fmt::format("backward end {}", index)] = now();
      });
    }
    auto y = x + torch::tanh(fc(x));
    y.register_hook([this](const torch::Tensor&) {
      (*g_events)[fmt::format("backward begin {}", index)] = now();
    });
    std::this_thread::sleep_for(kBlockCompute);
    (*g_events)[fmt::format("forward end {}", index)] = now();
    return y;
  }
  torch::nn::Linear fc;
  int index;
};
TORCH_MODULE(Block);

// A model as users write theirs: an embedding and a head around blocks, each block called
// through ddp::nn::call (the one line per unit a sharded model needs).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    embed = register_module("embed", torch::nn::Linear(12, 10));
    for (int i = 0; i < 3; ++i) blocks->push_back(Block(10, i));
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(10, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = embed(x);
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<BlockImpl>(i);
      h = ddp::nn::call(block, h);
    }
    return head(h);
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Net);

Net make_net() {
  torch::manual_seed(11);
  return Net();
}

void custom(const Group& g) {
  auto reference = make_net();
  torch::optim::SGD reference_opt(reference->parameters(),
                                  torch::optim::SGDOptions(0.1).momentum(0.9));
  auto net = make_net();
  ddp::FullyShardedDataParallel model(net.ptr(), net->blocks->children(), g);
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  expect(model.num_units() == 4, "three blocks and the root unit");
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    const torch::Tensor& x = batch.x;
    const torch::Tensor& y = batch.y;
    reference_opt.zero_grad();
    opt.zero_grad();
    // Two micro-batches: the halves of each rank's rows; the reference takes the same halves
    // of every rank's rows, so that its two backwards sum the same gradients.
    for (int half = 0; half < 2; ++half) {
      const auto mine = rows_of(x, g).narrow(0, half * 2, 2);
      const auto labels = rows_of(y, g).narrow(0, half * 2, 2);
      auto out = model.forward_with([&] { return net->forward(mine); });
      (torch::nn::functional::cross_entropy(out, labels) / 2).backward();
      const auto all = x.view({g->world_size(), 2, 2, 12}).select(1, half).reshape({-1, 12});
      const auto all_labels = y.view({g->world_size(), 2, 2}).select(1, half).reshape({-1});
      (torch::nn::functional::cross_entropy(reference->forward(all), all_labels) / 2).backward();
    }
    opt.step();
    reference_opt.step();
    expect_states_equal(model.state_dict(), state_of(*reference),
                        fmt::format("step {}: sharded == one process (two micro-batches)", step));
  }
  expect_sharded(model, g, {110, 110, 110, 12 * 10 + 10 + 10 * 5 + 5});
}

// A gather's time in flight: from its issue to its arrival on gloo's thread (the flight
// record's start and arrived).
struct InFlight {
  double issued = 0, arrived = 0;
};

// The gathers issued after collective `after_seq` (each "<phase>: gather <unit>" of the group's
// flight record), per unit in the order issued: each step's forward gather, then its backward's.
std::map<std::string, std::vector<InFlight>> gathers(const Group& g, uint64_t after_seq) {
  std::map<std::string, std::vector<InFlight>> found;
  for (const auto& record : g->recorder().records()) {
    if (record.seq <= after_seq) continue;
    const auto at = record.phase.find(": gather ");
    if (record.op.rfind("all_gather", 0) == 0 && at != std::string::npos) {
      found[record.phase.substr(at + 9)].push_back({record.start, record.arrived});
    }
  }
  return found;
}

constexpr int kOverlapSteps = 3;

// With prefetch, each block's all-gather is issued before the block before it (in the pass's
// order) has finished computing, and in some of the steps it is still in flight (not yet arrived
// on gloo's thread) while that block computes: the communication overlaps the computation, in the
// forward and in the backward. Each block's computation lasts a few milliseconds (a sleep), so
// that a gather issued ahead has something to overlap. Without prefetch (`prefetch` false) every
// gather is issued only after that block's computation ended, so none overlaps, and the scenario
// expects that.
void overlap(const Group& g, bool prefetch) {
  std::map<std::string, double> events;
  auto net = make_net();
  ddp::FullyShardedDataParallel model(net.ptr(), net->blocks->children(), g,
                                      ddp::FullyShardOptions().prefetch(prefetch));
  int issued_ahead = 0, overlapped = 0, checked = 0;
  int backward_ahead = 0, backward_overlapped = 0;
  for (int step = 0; step < kOverlapSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    events.clear();
    g_events = &events;
    const uint64_t before = g->last_seq();
    g->set_phase(fmt::format("step {}", step + 1));
    auto out = model.forward_with([&] { return net->forward(rows_of(batch.x, g)); });
    torch::nn::functional::cross_entropy(out, rows_of(batch.y, g)).backward();
    g_events = nullptr;
    const auto found = gathers(g, before);
    for (int k = 0; k < 3; ++k) {
      const auto& times = found.at(fmt::format("blocks.{}", k));
      expect(times.size() == 2, fmt::format("blocks.{} gathered twice (forward and backward)", k));
      if (times.size() != 2) return;
      // Forward: block k's gather against block k-1's forward; backward (blocks 2, 1, 0): block
      // k's against block k+1's backward.
      for (const bool forward : {true, false}) {
        if (forward ? k == 0 : k == 2) continue;
        const int other = forward ? k - 1 : k + 1;
        const InFlight& gather = times[forward ? 0 : 1];
        const char* pass = forward ? "forward" : "backward";
        const double begin = events.at(fmt::format("{} begin {}", pass, other));
        const double end = events.at(fmt::format("{} end {}", pass, other));
        const bool ahead = gather.issued < end;
        const bool in_flight = ahead && gather.arrived > begin;
        (forward ? issued_ahead : backward_ahead) += ahead ? 1 : 0;
        (forward ? overlapped : backward_overlapped) += in_flight ? 1 : 0;
        checked += forward ? 1 : 0;
      }
    }
  }
  const int all = checked;  // gathers checked per pass: 2 per step
  expect(issued_ahead == (prefetch ? all : 0) && backward_ahead == (prefetch ? all : 0),
         fmt::format("each gather issued before the block before it ended: {} of {} forward, {} "
                     "of {} backward ({} expected)",
                     issued_ahead, all, backward_ahead, all, prefetch ? "all" : "none"));
  expect(prefetch ? overlapped > 0 && backward_overlapped > 0
                  : overlapped == 0 && backward_overlapped == 0,
         fmt::format("gathers in flight while the block before computed: {} of {} forward, {} "
                     "of {} backward ({} expected)",
                     overlapped, all, backward_overlapped, all, prefetch ? "some" : "none"));
}

// A Sequential that can sit inside another (LibTorch's own has a templated forward, which a
// Sequential cannot hold), as the built-in ResNet's stages.
struct NestedImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Nested);

// One step of DDP on this rank's rows of `batch`, `plain` the module `ddp_model` wraps.
template <class Wrapped, class Net>
void ddp_step(Wrapped& ddp_model, Net& plain, torch::optim::Optimizer& opt, const Batch& batch,
              const Group& g) {
  opt.zero_grad();
  auto out = ddp_model->forward_with([&] { return plain->forward(rows_of(batch.x, g)); });
  torch::nn::functional::cross_entropy(out, rows_of(batch.y, g)).backward();
  opt.step();
}

torch::nn::Sequential make_bn_net() {
  torch::manual_seed(5);
  return torch::nn::Sequential(
      torch::nn::Linear(12, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
      Nested(torch::nn::Linear(16, 16), torch::nn::ReLU()), torch::nn::Linear(16, 5));
}

void versus_ddp(const Group& g) {
  auto plain = make_bn_net();
  ddp::DistributedDataParallel ddp_model(
      plain.ptr(), g, ddp::DistributedDataParallelOptions().broadcast_buffers(false));
  torch::optim::SGD ddp_opt(ddp_model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // The units named: the Linear layers, one of them inside a nested Sequential; BatchNorm's
  // parameters are the root unit's.
  auto net = make_bn_net();
  const uint64_t before = g->last_seq();
  ddp::FullyShardedDataParallel model(net, g, {},
                                      {net[0], net[3]->as<NestedImpl>()->ptr(0), net[4]});
  int broadcasts = 0;
  for (const auto& record : g->recorder().records()) {
    if (record.seq > before && record.op.rfind("broadcast", 0) == 0) ++broadcasts;
  }
  // init_sync: the four units' parameters (the root's: BatchNorm's), then BatchNorm's three
  // buffers coalesced, one broadcast per dtype (float32, int64).
  expect(broadcasts == 4 + 2, fmt::format("{} broadcasts at construction, 6 expected", broadcasts));
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    const torch::Tensor& x = batch.x;
    const torch::Tensor& y = batch.y;
    ddp_step(ddp_model, plain, ddp_opt, batch, g);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(rows_of(x, g)), rows_of(y, g)).backward();
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*plain),
                        fmt::format("step {}: sharded == DDP, buffers per rank", step));
  }
  expect_sharded(model, g, {12 * 16 + 16, 16 * 16 + 16, 16 * 5 + 5, 16 + 16});
}

// A group that counts the bytes of the floating-point all-reduces it carries (the across-hosts
// group of the hybrid scenario: what crosses hosts).
class CountingGroup : public ddp::testing::ForwardingGroup {
 public:
  using ForwardingGroup::ForwardingGroup;
  int64_t bytes = 0;

 protected:
  WorkPtr do_all_reduce(at::Tensor& t, Op op, const Info& info) override {
    if (t.is_floating_point()) bytes += static_cast<int64_t>(t.nbytes());
    return ForwardingGroup::do_all_reduce(t, op, info);
  }
};

// Hybrid sharding (HSDP) on 4 ranks as 2 hosts of 2 (ranks 0-1 and 2-3): the MLP sharded within
// each host and replicated across them, against DDP on all 4: equal after every step; each rank's
// shards (so its gradients and Adam's moments) half of DDP's parameters, padding aside; the bytes
// all-reduced across hosts per step half the gradient bytes DDP all-reduces.
void hybrid(const Group& g) {
  expect(g->world_size() == 4, "hybrid runs on 4 ranks");
  const ddp::comm::HostGroups groups = ddp::comm::host_groups(g, {"a", "a", "b", "b"});
  auto across = std::make_shared<CountingGroup>(groups.across);
  auto plain = make_mlp();
  ddp::DistributedDataParallel ddp_model(plain.ptr(), g);
  torch::optim::Adam ddp_opt(ddp_model->parameters(), torch::optim::AdamOptions(1e-2));
  auto net = make_mlp();
  ddp::FullyShardedDataParallel model(net, groups.host,
                                      ddp::FullyShardOptions().replicate_group(across));
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    ddp_step(ddp_model, plain, ddp_opt, batch, g);
    opt.zero_grad();
    across->bytes = 0;
    torch::nn::functional::cross_entropy(model.forward(rows_of(batch.x, g)), rows_of(batch.y, g))
        .backward();
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*plain),
                        fmt::format("step {}: hybrid-sharded == DDP on 4 ranks", step));
    int64_t ddp_bytes = 0;
    for (int64_t b : ddp_model->reducer().last_iteration().bucket_bytes) ddp_bytes += b;
    int64_t shard_bytes = 0;
    for (const auto& shard : model.parameters()) shard_bytes += shard.numel() * 4;
    expect(across->bytes == shard_bytes && std::abs(2 * across->bytes - ddp_bytes) <= 3 * 4,
           fmt::format("step {}: {} bytes across hosts, DDP all-reduced {}: 1/2, padding aside",
                       step, across->bytes, ddp_bytes));
  }
  int64_t held = 0, whole = 0, moments = 0;
  for (const auto& shard : model.parameters()) held += shard.numel();
  for (const auto& p : plain->parameters()) whole += p.numel();
  for (const auto& item : opt.state()) {
    moments += static_cast<const torch::optim::AdamParamState&>(*item.second).exp_avg().numel();
  }
  expect(
      moments == held && std::abs(2 * held - whole) <= 3,
      fmt::format("each rank holds {} of DDP's {} parameters (and as many gradients and moments)",
                  held, whole));
  expect_sharded(model, groups.host, {12 * 24 + 24, 24 * 16 + 16, 16 * 5 + 5});
}

// The adapted net (adapted_net.h) of width 12, adapters of rank 3, 5 classes, from one seed.
ddp::testing::AdaptedNet make_adapted_net() {
  torch::manual_seed(13);
  return ddp::testing::AdaptedNet(12, 3, 5);
}

void adapters(const Group& g) {
  auto plain = make_adapted_net();
  ddp::DistributedDataParallel ddp_model(plain.ptr(), g);
  const auto trainable = ddp::testing::trainable_parameters(*plain);
  torch::optim::Adam ddp_opt(trainable, torch::optim::AdamOptions(1e-2));
  auto net = make_adapted_net();
  ddp::FullyShardedDataParallel model(net.ptr(), {net->stem.ptr(), net->a.ptr(), net->b.ptr()}, g);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    ddp_step(ddp_model, plain, ddp_opt, batch, g);
    opt.zero_grad();
    auto out = model.forward_with([&] { return net->forward(rows_of(batch.x, g)); });
    torch::nn::functional::cross_entropy(out, rows_of(batch.y, g)).backward();
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*plain),
                        fmt::format("step {}: frozen bases, trained adapters == DDP", step));
  }
  const auto shards = model.parameters();
  expect(!shards[0].grad().defined(), "the frozen unit's shard has no gradient");
  // The shards: the frozen stem's, a's and b's adapters only, the head's (the root unit); a's and
  // b's frozen bases are sharded apart.
  const int64_t world = g->world_size();
  auto part = [&](int64_t numel) { return (numel + world - 1) / world; };
  const std::vector<int64_t> want = {part(12 * 12 + 12), part(2 * 3 * 12), part(2 * 3 * 12),
                                     part(12 * 5 + 5)};
  int64_t bytes = 2 * part(12 * 12 + 12) * 4;
  bool sizes = shards.size() == want.size();
  for (size_t i = 0; sizes && i < shards.size(); ++i) {
    sizes = shards[i].numel() == want[i];
    bytes += shards[i].nbytes();
  }
  expect(sizes, "the adapters' shards hold the trainable parameters only");
  expect(model.resident_parameter_bytes() == bytes,
         fmt::format("nothing gathered between steps: {} bytes resident, {} in shards",
                     model.resident_parameter_bytes(), bytes));
  bool no_grads = true;
  for (const auto& p : net->parameters()) no_grads = no_grads && !p.grad().defined();
  expect(no_grads, "no parameter of the module holds a gradient");
}

// Two parameter groups of AdamW, as an optimizer of a whole model takes them: weight decay on the
// weights, none on the biases.
std::vector<torch::optim::OptimizerParamGroup> decay_groups(const NamedTensors& named) {
  std::vector<torch::Tensor> weights, biases;
  for (const auto& [name, p] : named) {
    const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    (bias ? biases : weights).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(1e-2).weight_decay(0.5)));
  groups.emplace_back(biases, std::make_unique<torch::optim::AdamWOptions>(
                                  torch::optim::AdamWOptions(1e-2).weight_decay(0)));
  return groups;
}

void param_groups(const Group& g) {
  auto plain = make_mlp();
  ddp::DistributedDataParallel ddp_model(plain.ptr(), g);
  NamedTensors whole;
  for (const auto& item : plain->named_parameters()) whole.emplace_back(item.key(), item.value());
  torch::optim::AdamW ddp_opt(decay_groups(whole), torch::optim::AdamWOptions(1e-2));
  auto net = make_mlp();
  ddp::FullyShardedDataParallel model(net, g);
  const auto pieces = model.named_parameters();
  bool names = pieces.size() == whole.size();
  int64_t held = 0;
  for (size_t i = 0; names && i < pieces.size(); ++i) {
    names = pieces[i].first == whole[i].first && pieces[i].second.dim() == 1;
    held += pieces[i].second.numel();
  }
  expect(names, "named_parameters: the model's names, in its order, each a 1-D piece");
  int64_t shards = 0;
  for (const auto& shard : model.parameters()) shards += shard.numel();
  expect(held <= shards, fmt::format("the pieces hold {} elements, the shards {}", held, shards));
  torch::optim::AdamW opt(decay_groups(pieces), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    ddp_step(ddp_model, plain, ddp_opt, batch, g);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(rows_of(batch.x, g)), rows_of(batch.y, g))
        .backward();
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*plain),
                        fmt::format("step {}: weight decay per parameter group == DDP", step));
  }
}

// Units that a step uses on some ranks only (Note [Units unused on some ranks] in
// src/core/fsdp/in_order.h): `a`, a branch the rank takes or not; `side`, an output every rank
// computes and some leave out of the loss; `late`, called by every rank in the first step only.
struct BranchyImpl : torch::nn::Module {
  torch::nn::Linear stem{12, 16}, a{16, 16}, side{16, 5}, c{16, 16}, late{16, 16}, head{16, 5};
  BranchyImpl() {
    register_module("stem", stem);
    register_module("a", a);
    register_module("side", side);
    register_module("c", c);
    register_module("late", late);
    register_module("head", head);
  }
  torch::Tensor forward(torch::Tensor x, bool take_a, bool use_side, bool first_step) {
    x = torch::relu(ddp::nn::call(stem, x));
    if (take_a) x = torch::relu(ddp::nn::call(a, x));
    auto aside = ddp::nn::call(side, x);
    x = torch::relu(ddp::nn::call(c, x));
    if (first_step) x = torch::relu(ddp::nn::call(late, x));
    auto out = head(x);
    return use_side ? out + aside : out;
  }
};
TORCH_MODULE(Branchy);

Branchy make_branchy() {
  torch::manual_seed(17);
  return Branchy();
}

void unused(const Group& g) {
  auto plain = make_branchy();
  ddp::DistributedDataParallel ddp_model(
      plain.ptr(), g, ddp::DistributedDataParallelOptions().find_unused_parameters(true));
  torch::optim::Adam ddp_opt(ddp_model->parameters(), torch::optim::AdamOptions(1e-2));
  auto net = make_branchy();
  ddp::FullyShardedDataParallel model(
      net.ptr(), {net->stem.ptr(), net->a.ptr(), net->side.ptr(), net->c.ptr(), net->late.ptr()},
      g);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = global_batch(step, g->world_size(), 12);
    const bool take_a = (g->rank() + step) % 2 == 0, use_side = (g->rank() + step) % 3 != 1;
    const auto x = rows_of(batch.x, g), y = rows_of(batch.y, g);
    ddp_opt.zero_grad();
    auto want = ddp_model->forward_with([&] { return plain->forward(x, take_a, use_side, !step); });
    torch::nn::functional::cross_entropy(want, y).backward();
    ddp_opt.step();
    opt.zero_grad();
    auto out = model.forward_with([&] { return net->forward(x, take_a, use_side, !step); });
    const auto loss = torch::nn::functional::cross_entropy(out, y);
    // Where every unit called reaches the loss, a plain backward does.
    use_side ? loss.backward() : model.backward(loss);
    opt.step();
    expect_states_equal(model.state_dict(), state_of(*plain),
                        fmt::format("step {}: units unused on some ranks == DDP", step));
  }
  expect_sharded(model, g,
                 {12 * 16 + 16, 16 * 16 + 16, 16 * 5 + 5, 16 * 16 + 16, 16 * 16 + 16, 16 * 5 + 5});
}

// One step of the adapted net on `on`'s ranks, each with its part of the step's 12 rows.
void adapted_step(ddp::FullyShardedDataParallel& model, ddp::testing::AdaptedNet& net,
                  torch::optim::Optimizer& opt, const Group& on, int step) {
  const Batch batch = global_batch(step, 3, 12);
  const int64_t rows = 12 / on->world_size();
  opt.zero_grad();
  const auto x = batch.x.narrow(0, on->rank() * rows, rows);
  auto out = model.forward_with([&] { return net->forward(x); });
  torch::nn::functional::cross_entropy(out, batch.y.narrow(0, on->rank() * rows, rows)).backward();
  opt.step();
}

// The adapted net (frozen bases, trainable adapters), whose units are its stem, a and b.
std::unique_ptr<ddp::FullyShardedDataParallel> shard_adapted(ddp::testing::AdaptedNet& net,
                                                             const Group& on) {
  return std::make_unique<ddp::FullyShardedDataParallel>(
      net.ptr(),
      std::vector<std::shared_ptr<torch::nn::Module>>{net->stem.ptr(), net->a.ptr(), net->b.ptr()},
      on);
}

void checkpoints(const Group& g, const std::string& dir) {
  const ddp::train::OptimizerFactory make = [](const std::vector<torch::Tensor>& params) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  };
  auto net = make_adapted_net();
  auto model = shard_adapted(net, g);
  auto opt = make(model->parameters());
  ddp::train::ShardedCheckpoint checkpoint(*model, *opt, make, g);
  adapted_step(*model, net, *opt, g, 0);
  adapted_step(*model, net, *opt, g, 1);
  checkpoint.save_async(dir + "/sharded");  // written while the next step trains
  checkpoint.save(dir + "/sharded-now");    // written before it returns, from the state itself
  checkpoint.save_gathered(dir + "/checkpoint.pt");
  adapted_step(*model, net, *opt, g, 2);
  checkpoint.wait();
  const auto want = model->state_dict();
  const Group pair = g->new_group({0, 1});  // null on the ranks not in it
  for (const std::string file : {"sharded", "sharded-now", "checkpoint.pt"}) {
    for (const Group& on : {g, pair}) {
      if (on == nullptr) continue;
      torch::manual_seed(99);  // other values everywhere, the frozen bases too, until loaded
      ddp::testing::AdaptedNet again(12, 3, 5);
      auto resumed = shard_adapted(again, on);
      auto resumed_opt = make(resumed->parameters());
      ddp::train::ShardedCheckpoint(*resumed, *resumed_opt, make, on).load(dir + "/" + file);
      adapted_step(*resumed, again, *resumed_opt, on, 2);
      expect_states_equal(
          resumed->state_dict(), want,
          fmt::format("{} loaded on {} ranks, one more step", file, on->world_size()));
    }
  }
  try {  // every rank says so, none waits
    checkpoint.load(dir + "/missing.pt");
    expect(false, "a checkpoint that is not there loaded");
  } catch (const ddp::Error& e) {
    expect(std::string(e.what()).find("missing.pt") != std::string::npos, e.what());
  }
}

}  // namespace

int run(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::cerr << "usage: fsdp_worker BACKEND "
                 "sequential|custom|overlap|versus-ddp|adapters|param-groups|hybrid|unused|"
                 "checkpoints "
                 "[DIR]\n";
    return 64;
  }
  try {
    Group group = ddp::testing::worker_group(argv[1]);
    const std::string scenario = argv[2];
    if (scenario == "sequential") {
      sequential(group);
    } else if (scenario == "custom") {
      custom(group);
    } else if (scenario == "overlap") {
      overlap(group, /*prefetch=*/true);
      overlap(group, /*prefetch=*/false);
    } else if (scenario == "versus-ddp") {
      versus_ddp(group);
    } else if (scenario == "adapters") {
      adapters(group);
    } else if (scenario == "param-groups") {
      param_groups(group);
    } else if (scenario == "hybrid") {
      hybrid(group);
    } else if (scenario == "unused") {
      unused(group);
    } else if (scenario == "checkpoints" && argc == 4) {
      checkpoints(group, argv[3]);
    } else {
      std::cerr << "unknown scenario " << scenario << "\n";
      return 64;
    }
    std::cout << fmt::format("rank {}/{}: {} failures\n", group->rank(), group->world_size(),
                             g_failures);
    return g_failures == 0 ? 0 : 3;
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace fsdp_worker
