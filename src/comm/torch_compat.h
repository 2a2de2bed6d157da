#pragma once
// What differs between the LibTorch releases ddp builds against (Debian 12's 1.13, Debian 13's 2.6,
// PyTorch's 2.x wheels), in one place; all other code is the same source for every release.
// Differences are detected from the API itself, not from version numbers, so that a release
// between the ones tested behaves as the API it has.

#include <type_traits>
#include <utility>

namespace ddp::comm::compat {

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

}  // namespace ddp::comm::compat
