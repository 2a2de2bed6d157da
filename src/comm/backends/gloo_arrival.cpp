// When c10d's gloo work completes on gloo's own thread (gloo_backend.cpp's flight record). A file
// of its own for one warning flag: GCC 14 sees an uninitialized device guard in LibTorch 2.6's
// Future::invokeCallback, which every callback added to a future instantiates (a false positive,
// as those of activation_checkpoint.cpp); src/CMakeLists.txt silences it for this file only.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>

namespace ddp::comm {

void on_arrival(c10d::Work& work, std::function<void()> arrived) {
  // Every work the gloo backend wraps has a future; c10d's base Work throws, and nothing is told.
  try {
    work.getFuture()->addCallback(
        [arrived = std::move(arrived)](c10::ivalue::Future& /*future*/) { arrived(); });
  } catch (const c10::Error&) {
  }
}

}  // namespace ddp::comm
