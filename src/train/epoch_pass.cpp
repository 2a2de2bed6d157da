#include "epoch_pass.h"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/common/error.h"
#include "ddp/data/distributed_sampler.h"

namespace ddp::train {
namespace {

// Optimizer steps over `samples` of one rank, in batches of `batch_size`.
int64_t steps_for(const Config& config, int64_t batch_size, int64_t samples) {
  const int64_t batches = (samples + batch_size - 1) / batch_size;
  return (batches + config.grad_accum_steps - 1) / config.grad_accum_steps;
}

// How the training batches of `epoch` are prepared (--workers, --pin-memory, --augment) for a
// batch of `batch_size` on this rank, in a pass that starts after `first_step` of its steps.
data::LoaderOptions loader_options(const Config& config, const Distributed& dist,
                                   int64_t batch_size, int64_t epoch, int64_t first_step) {
  data::LoaderOptions o;
  o.batch_size = batch_size;
  o.workers = static_cast<int>(config.workers);
  o.pin_memory = config.pin_memory && dist.device.is_cuda();  // pinning needs CUDA
  if (config.augment) {
    data::Augment augment;
    augment.pad_value = -data::kFashionMnistMean / data::kFashionMnistStd;  // black, normalised
    o.augment = augment;
  }
  o.seed = static_cast<uint64_t>(config.seed);
  o.epoch = epoch;
  o.first_batch = first_step * config.grad_accum_steps;
  o.rank = dist.rank();
  return o;
}

}  // namespace

void EpochPass::count_step(const torch::Tensor& losses, int64_t samples) {
  loss_sum += losses;
  trained += samples;
  progress->update(++step, trained, [this] { return running_loss(); });
}

double EpochPass::running_loss() const {
  return trained > 0 ? loss_sum.item<double>() / static_cast<double>(trained) : 0.0;
}

torch::Tensor EpochPass::step_ids() const {
  const int64_t size = order.size(0);
  const int64_t begin = std::min((step - first_step) * per_step, size);
  return order.narrow(0, begin, std::min(per_step, size - begin)).contiguous();
}

EpochPosition EpochPass::position(int64_t world) const {
  return {epoch, step, steps, sequence,
          data::trained_prefix(sequence.size(0), world, (step - first_step) * per_step)};
}

EpochPass begin_epoch(const Config& config, const Distributed& dist, const Workload& workload,
                      const TrainState& state, ProgressStyle progress, int64_t epoch) {
  const int64_t world = dist.world_size();
  const int64_t batch = state.batch_size();
  const EpochPosition start = state.position();
  // --uneven: unpadded (ranks' shares differ by one at most); else padded to the same size on
  // every rank, the same number of steps.
  const bool resumed = epoch == start.epoch && state.untrained().defined();
  EpochPass pass;
  pass.sequence = resumed ? data::reshard(state.untrained(), world, !config.uneven)
                          : epoch_sequence(config, workload.train_set.size(), epoch, world);
  const torch::Tensor order = data::rank_share(pass.sequence, world, dist.rank());
  const int64_t n = config.drop_last ? order.size(0) / batch * batch : order.size(0);
  if (n == 0 && !resumed) {
    throw InputError(fmt::format("drop-last: each rank's {} samples are fewer than one batch of {}",
                                 order.size(0), batch));
  }
  pass.epoch = epoch;
  // A resumed epoch goes on after the steps its checkpoint had taken.
  pass.first_step = resumed ? start.epoch_step : 0;
  pass.step = pass.first_step;
  // The steps of the rank with the most samples (rank 0's with --uneven): the learning-rate
  // schedule's epoch length, the same on every rank.
  const int64_t longest = config.uneven ? (pass.sequence.size(0) + world - 1) / world : n;
  pass.steps = pass.first_step + steps_for(config, batch, longest);
  pass.per_step = batch * config.grad_accum_steps;
  workload.module->train();
  pass.loss_sum = torch::zeros({}, torch::TensorOptions(torch::kDouble).device(dist.device));
  pass.start = std::chrono::steady_clock::now();
  const data::LoaderOptions options = loader_options(config, dist, batch, epoch, pass.first_step);
  pass.pin_memory = options.pin_memory;
  pass.order = order.narrow(0, 0, n);
  pass.loader = std::make_unique<data::BatchLoader>(workload.train_set, pass.order, options);
  pass.first = epoch == start.epoch;
  pass.progress.emplace(progress, config.progress_every, epoch + 1, config.epochs, pass.steps,
                        world);
  return pass;
}

}  // namespace ddp::train
