#include "diloco_mode.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"
#include "phase.h"

namespace ddp::train {

void DiLoCoMode::build(bool init_sync) {
  DdpMode::build(init_sync);
  diloco_ =
      std::make_unique<DiLoCo>(run_.workload.module->parameters(), run_.dist.group, options());
}

DiLoCoOptions DiLoCoMode::options() const {
  const Config& c = run_.config;
  return {c.sync_every, c.outer_lr, c.outer_momentum, /*nesterov=*/true, c.sync_delay};
}

void DiLoCoMode::after_step(int64_t step, double /*seconds*/) {
  const Phase phase = step_phase(*run_.dist.group, run_.timeline, "synchronization", step);
  diloco_->after_inner_step();
}

void DiLoCoMode::end_epoch(int64_t epoch) {
  const Phase phase(*run_.dist.group, fmt::format("epoch {}: synchronization", epoch));
  diloco_->synchronize_if_pending();
}

void DiLoCoMode::fill_optimizer(Checkpoint& c) {
  // Every rank's inner optimizer, for rank 0 to write; the outer momentum is every rank's.
  const std::string mine = serialized(optimizer());
  const std::vector<std::string> inner =
      comm::all_gather_bytes(*run_.dist.group, mine, run_.dist.device);
  if (!run_.dist.is_main()) return;
  c.optimizer_state = byte_tensor(mine);
  for (const auto& state : inner) c.inner_optimizers.push_back(byte_tensor(state));
  for (size_t i = 0; i < diloco_->momentum().size(); ++i) {
    c.outer_momentum.emplace_back(std::to_string(i), diloco_->momentum()[i].cpu());
  }
}

// This rank's own inner optimizer, and the outer momentum; the model just loaded becomes the
// global parameters. From a checkpoint of a run that did not train alone, every rank's inner
// optimizer starts from its optimizer state and the momentum from nothing.
void DiLoCoMode::load_optimizer_state(const Checkpoint& c, const std::string& path) {
  const Distributed& dist = run_.dist;
  if (c.inner_optimizers.empty()) {
    DdpMode::load_optimizer_state(c, path);
    diloco_->restart({});
    return;
  }
  if (static_cast<int>(c.inner_optimizers.size()) != dist.world_size()) {
    throw InputError(fmt::format(
        "{}: saved by {} ranks training alone (local-sgd or diloco), each with an optimizer of "
        "its own; resume it on {} ranks",
        path, c.inner_optimizers.size(), c.inner_optimizers.size()));
  }
  load_optimizer(optimizer(), c.inner_optimizers[static_cast<size_t>(dist.rank())], path,
                 dist.device);
  std::vector<at::Tensor> momentum;
  for (const auto& [index, tensor] : c.outer_momentum) momentum.push_back(tensor.to(dist.device));
  diloco_->restart(std::move(momentum));
}

}  // namespace ddp::train
