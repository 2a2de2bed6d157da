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
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <optional>
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

template <typename Impl, typename = void>
struct HasStorageErrorMessage : std::false_type {};
template <typename Impl>
struct HasStorageErrorMessage<
    Impl, std::void_t<decltype(std::declval<Impl&>()
                                   .release_storage_and_set_meta_custom_data_ptr_error_msg_(
                                       std::optional<std::string>()))>> : std::true_type {};

// A tensor shaped, typed and placed as `like` that has no storage: LibTorch throws c10::Error at
// any read of its data or storage (never a read of freed memory), while its sizes, dtype and
// device stay readable. The error says `message` where the release lets a tensor carry one (the
// custom message FakeTensor uses: 2.6 has it); 1.13 says "Cannot access data pointer of Tensor
// that doesn't have storage" or "Cannot access storage of TensorImpl".
template <typename Impl = c10::TensorImpl>
at::Tensor storageless_like(const at::Tensor& like, const std::string& message) {
  auto impl = c10::make_intrusive<Impl>(like.key_set(), like.dtype(), like.device());
  impl->set_sizes_contiguous(like.sizes());
  impl->set_storage_access_should_throw();
  if constexpr (HasStorageErrorMessage<Impl>::value) {
    impl->release_storage_and_set_meta_custom_data_ptr_error_msg_(message);
  }
  return at::Tensor(std::move(impl));
}

}  // namespace ddp::compat
