// Must not compile (ctest: DistributedDataParallel.AForwardTheModuleLacksFailsToCompile...):
// model->forward(...) with arguments the wrapped module's forward does not take stops the build
// with the wrapper's message, which says what to do, rather than pages of template errors. One
// mistake per target (tests/CMakeLists.txt defines DDP_MISTAKE_<name>), so that each is checked on
// its own.
#include <torch/torch.h>

#include "ddp/core/distributed_data_parallel.h"

struct Net : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 2))};
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
};

#if defined(DDP_MISTAKE_two_inputs)
void two_inputs(ddp::DistributedDataParallel<Net>& model) {
  model->forward(torch::ones({1, 4}), torch::ones({1, 4}));  // Net::forward takes one
}
#elif defined(DDP_MISTAKE_module_without_type)
void module_without_type(ddp::DistributedDataParallel<>& model) {
  model->forward(torch::ones({1, 4}));  // torch::nn::Module has no forward: forward_with
}
#else
#error "define DDP_MISTAKE_two_inputs or DDP_MISTAKE_module_without_type"
#endif

int main() {
  return 0;
}
