#pragma once
// What differs between the LibTorch releases ddp builds against (Debian 12's 1.13, Debian 13's 2.6,
// PyTorch's 2.x wheels), in one place; all other code is the same source for every release.
// Where the API itself can tell (a member that exists or not, a type), differences are detected
// from it, so that a release between the ones tested behaves as the API it has; a version number
// decides only where the old and the new API both compile.
//
// A private header of the layers that use LibTorch (src/CMakeLists.txt adds its directory).

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace ddp::compat {

template <typename Options, typename = void>
struct HasUseLibUv : std::false_type {};
template <typename Options>
struct HasUseLibUv<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>>
    : std::true_type {};

// c10d::TCPStoreOptions gained `useLibUV` in 2.2 and defaults it to true from 2.4; a LibTorch built
// without libuv (Debian 13's 2.6) then refuses every TCPStore, clients too ("use_libuv was
// requested but PyTorch was build without libuv support"). The classic implementation is in every
// build and speaks the same protocol to either kind of server. 1.13 has only the classic one.
template <typename TcpStoreOptions>
void use_classic_tcp_store(TcpStoreOptions& options) {
  if constexpr (HasUseLibUv<TcpStoreOptions>::value) options.useLibUV = false;
}

// What autograd's grad_accumulator(param) returns: a std::shared_ptr<Node> up to 2.x, an
// intrusive_ptr after (the reducer keeps them alive: autograd holds them only weakly).
using GradAccumulator =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// Autocast's state per device type. LibTorch 2.4 replaced the per-device functions
// (set_cpu_enabled, set_enabled for CUDA, ...) by ones taking the device type and deprecated the
// old ones; 1.13 has only the old ones. Both compile in 2.4+, hence the version test.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool autocast_enabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
inline void set_autocast_enabled(c10::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
inline void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
inline bool autocast_enabled(c10::DeviceType type) {
  return type == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
inline void set_autocast_enabled(c10::DeviceType type, bool on) {
  type == c10::kCUDA ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
}
inline c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return type == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                            : at::autocast::get_autocast_cpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  type == c10::kCUDA ? at::autocast::set_autocast_gpu_dtype(dtype)
                     : at::autocast::set_autocast_cpu_dtype(dtype);
}
#endif

// The key of parameter `p` in `optimizer.state()`: its TensorImpl's address as text up to 1.13
// (what c10::guts::to_string printed), the address itself in 2.x.
template <typename Optimizer>
auto optimizer_state_key(const Optimizer& optimizer, const at::Tensor& p) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace ddp::compat
