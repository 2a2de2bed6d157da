#pragma once
// Uneven inputs, as PyTorch's torch.distributed.algorithms.Join:
//
//   ddp::join(model, [&] {
//     for (auto& batch : my_batches) {   // as many as this rank has: they may differ
//       model->zero_grad();
//       loss_fn(model->forward(batch.x), batch.y).backward();
//       optimizer.step();
//     }
//   });
//
// A rank that runs out of batches keeps joining the others' collectives with zero gradients
// until every rank is done; the gradients average over the whole world (a joined rank counts as
// zeros); at the end every rank holds the model of the last to finish.
// DistributedDataParallelBase::begin_join() states the rules.

#include <utility>

#include "ddp/core/distributed_data_parallel.h"

namespace ddp {

template <class M, class Loop>
void join(DistributedDataParallel<M>& model, Loop&& loop) {
  model->begin_join();
  std::forward<Loop>(loop)();
  model->finish_join();
}

}  // namespace ddp
