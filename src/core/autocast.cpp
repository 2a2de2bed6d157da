#include "ddp/core/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "torch_compat.h"

namespace ddp::amp {

Autocast::Autocast(c10::DeviceType device_type, c10::ScalarType dtype)
    : device_type_(device_type),
      was_enabled_(compat::autocast_enabled(device_type)),
      previous_dtype_(compat::autocast_dtype(device_type)) {
  // torch.autocast.__enter__'s steps, the dtype first: LibTorch 1.13 throws for one it does not
  // take on the device (CPU: bfloat16 only), and then nothing has changed yet.
  compat::set_autocast_dtype(device_type_, dtype);
  compat::set_autocast_enabled(device_type_, true);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // torch.autocast.__exit__'s: the cache of float32 weights cast to 16 bits lives as long as the
  // outermost scope.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(device_type_, was_enabled_);
  compat::set_autocast_dtype(device_type_, previous_dtype_);
}

std::string autocast_unsupported(c10::DeviceType device_type, c10::ScalarType dtype) {
  try {
    const auto options = torch::TensorOptions().device(device_type);
    const auto x = torch::ones({2, 2}, options);
    const Autocast autocast(device_type, dtype);
    const auto y = torch::linear(x, x, x[0]);
    if (y.scalar_type() != dtype) {
      return std::string("autocast ran the matmul in ") + c10::toString(y.scalar_type());
    }
    return "";
  } catch (const c10::Error& e) {
    const std::string text = e.msg();
    return text.substr(0, text.find('\n'));
  }
}

}  // namespace ddp::amp
