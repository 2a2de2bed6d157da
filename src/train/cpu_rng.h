#pragma once
// The CPU generator's state (private to the train layer): saved in checkpoints, and kept
// unchanged across an evaluation.

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <mutex>

namespace ddp::train {

inline at::Tensor cpu_rng_state() {
  auto generator = at::globalContext().defaultGenerator(at::kCPU);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

inline void set_cpu_rng_state(const at::Tensor& state) {
  auto generator = at::globalContext().defaultGenerator(at::kCPU);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Restores the CPU generator's state when it goes out of scope. Evaluation draws random numbers
// (ProbSparse attention samples keys), and must not move training's stream: otherwise training
// would depend on --eval-every, and a run resumed after a checkpoint written where an uninterrupted
// run evaluated differently would not repeat it.
class KeepCpuRng {
 public:
  KeepCpuRng() : state_(cpu_rng_state()) {}
  ~KeepCpuRng() { set_cpu_rng_state(state_); }
  KeepCpuRng(const KeepCpuRng&) = delete;
  KeepCpuRng& operator=(const KeepCpuRng&) = delete;

 private:
  at::Tensor state_;
};

}  // namespace ddp::train
