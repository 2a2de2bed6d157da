#include "ddp/core/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace ddp::amp {
namespace {

// LibTorch 2.4 replaced the per-device functions (set_cpu_enabled, set_enabled for CUDA...) by
// ones taking the device type, and deprecated the old ones; 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool is_enabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
void set_enabled(c10::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
c10::ScalarType get_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void set_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool is_enabled(c10::DeviceType type) {
  return type == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType type, bool on) {
  type == c10::kCUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
c10::ScalarType get_dtype(c10::DeviceType type) {
  return type == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                            : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  type == c10::kCUDA ? at::autocast::set_autocast_gpu_dtype(dtype)
                     : at::autocast::set_autocast_cpu_dtype(dtype);
}
#endif

}  // namespace

Autocast::Autocast(c10::DeviceType device_type, c10::ScalarType dtype)
    : device_type_(device_type),
      was_enabled_(is_enabled(device_type)),
      previous_dtype_(get_dtype(device_type)) {
  // torch.autocast.__enter__'s steps, the dtype first: LibTorch 1.13 throws for one it does not
  // take on the device (CPU: bfloat16 only), and then nothing has changed yet.
  set_dtype(device_type_, dtype);
  set_enabled(device_type_, true);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // torch.autocast.__exit__'s: the cache of float32 weights cast to 16 bits lives as long as the
  // outermost scope.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_type_, was_enabled_);
  set_dtype(device_type_, previous_dtype_);
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
