#include "ddp/core/grad_scaler.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/comm/host_collectives.h"
#include "ddp/common/error.h"

namespace ddp::amp {

GradScaler::GradScaler(std::shared_ptr<comm::ProcessGroup> group, GradScalerOptions options)
    : group_(std::move(group)) {
  state_.scale = options.init_scale();
  state_.growth_factor = options.growth_factor();
  state_.backoff_factor = options.backoff_factor();
  state_.growth_interval = options.growth_interval();
  if (!(state_.scale > 0) || !(state_.growth_factor > 1) || !(state_.backoff_factor > 0) ||
      !(state_.backoff_factor < 1) || state_.growth_interval < 1) {
    throw InputError(fmt::format(
        "GradScaler: init_scale {} must be > 0, growth_factor {} > 1, backoff_factor {} in "
        "(0, 1) and growth_interval {} >= 1",
        state_.scale, state_.growth_factor, state_.backoff_factor, state_.growth_interval));
  }
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return loss * static_cast<float>(state_.scale);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (unscaled_) {
    throw Error(
        "GradScaler: unscale_() has already been called on this optimizer since the last "
        "update()");
  }
  // PyTorch's inverse: the reciprocal in double, rounded to float.
  const auto inverse = static_cast<float>(1.0 / state_.scale);
  torch::NoGradGuard no_grad;
  bool found = false;
  c10::Device device(torch::kCPU);
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto& grad = p.mutable_grad();
      if (!grad.defined()) continue;
      device = grad.device();
      found = found || !torch::isfinite(grad).all().item<bool>();
      grad.mul_(inverse);
    }
  }
  found_inf_ = group_ ? comm::any_rank(*group_, found, device) : found;
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (stepped_) throw Error("GradScaler: step() has already been called since the last update()");
  if (!unscaled_) unscale_(optimizer);
  stepped_ = true;
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!unscaled_) throw Error("GradScaler: update() without unscale_() or step() before it");
  // torch._amp_update_scale_'s rule.
  if (found_inf_) {
    state_.scale *= state_.backoff_factor;
    state_.growth_tracker = 0;
  } else if (++state_.growth_tracker == state_.growth_interval) {
    state_.scale *= state_.growth_factor;
    state_.growth_tracker = 0;
  }
  unscaled_ = stepped_ = found_inf_ = false;
}

c10::IValue to_ivalue(const GradScalerState& state) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("scale", state.scale);
  dict.insert("growth_factor", state.growth_factor);
  dict.insert("backoff_factor", state.backoff_factor);
  dict.insert("growth_interval", state.growth_interval);
  dict.insert("_growth_tracker", state.growth_tracker);
  return dict;
}

GradScalerState grad_scaler_state_from(const c10::IValue& value, const std::string& origin) {
  if (!value.isGenericDict()) {
    throw InputError(fmt::format("{}: GradScaler state is not a dict", origin));
  }
  const auto dict = value.toGenericDict();
  // A float, an int, or a tensor of one element (how checkpoints hold floats).
  auto number = [&](const char* key) {
    const c10::IValue v = dict.contains(key) ? dict.at(key) : c10::IValue();
    if (v.isDouble()) return v.toDouble();
    if (v.isInt()) return static_cast<double>(v.toInt());
    if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
    throw InputError(fmt::format("{}: GradScaler state has no number '{}'", origin, key));
  };
  GradScalerState s;
  s.scale = number("scale");
  s.growth_factor = number("growth_factor");
  s.backoff_factor = number("backoff_factor");
  s.growth_interval = static_cast<int64_t>(number("growth_interval"));
  s.growth_tracker = static_cast<int64_t>(number("_growth_tracker"));
  return s;
}

}  // namespace ddp::amp
