#pragma once
// Mixed precision's forward: PyTorch's torch.autocast as a scope. Inside it, LibTorch runs the
// ops it lists as safe in 16 bits (matmuls, convolutions) in `dtype` and keeps the others (losses,
// reductions, softmax) in float32; parameters stay float32, and so do their gradients.
//
//   {
//     ddp::amp::Autocast autocast(torch::kCPU, torch::kBFloat16);
//     loss = loss_fn(model->forward(x), y);
//   }
//   loss.backward();  // outside, as PyTorch's recipe
//
// bfloat16 needs no loss scaling; float16 does (core/grad_scaler.h).

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace ddp::amp {

class Autocast {
 public:
  // Enters autocast on `device_type` (kCPU or kCUDA) in `dtype` (kBFloat16 or kHalf).
  Autocast(c10::DeviceType device_type, c10::ScalarType dtype);
  // Restores the previous state; the outermost scope also drops the weights' cached casts.
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool was_enabled_;
  c10::ScalarType previous_dtype_;
};

// Whether this LibTorch runs a Linear layer under autocast in `dtype` on `device_type`: "" when
// it does, else the first line of LibTorch's reason (LibTorch 1.13's CPU autocast takes bfloat16
// only).
std::string autocast_unsupported(c10::DeviceType device_type, c10::ScalarType dtype);

}  // namespace ddp::amp
