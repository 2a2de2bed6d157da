#include "ddp/nn/forward_hooks.h"

namespace ddp::nn {
namespace {

thread_local ForwardHooks* t_hooks = nullptr;

}  // namespace

ForwardHooks* ForwardHooks::current() {
  return t_hooks;
}

ForwardHooks* ForwardHooks::install(ForwardHooks* hooks) {
  ForwardHooks* previous = t_hooks;
  t_hooks = hooks;
  return previous;
}

}  // namespace ddp::nn
