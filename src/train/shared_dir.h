#pragma once
// Whether every rank sees the same output directory: what --checkpoint-sharded needs (each rank
// writes its own file of a checkpoint, a resume reads every rank's, and rank 0 deletes the old
// ones), and what hosts that each have a directory of their own under the same path do not give.
// A private header of the train layer.
#include <torch/types.h>

#include <string>
#include <vector>

#include "ddp/comm/process_group.h"

namespace ddp::train {

// The ranks whose entry in `seen` (one per rank: 1 when it saw rank 0's file) is 0. A pure
// function.
std::vector<int> ranks_not_seeing(const std::vector<int64_t>& seen);

// Rank 0 writes a file of a name no run used before into `dir`, every rank looks for it, and rank
// 0 removes it (a collective, on `device`'s tensors). Throws InputError on every rank, naming
// `dir`, the ranks that did not see it and `needed_by`, where some rank did not.
void check_dir_shared(comm::ProcessGroup& group, const torch::Device& device,
                      const std::string& dir, const std::string& needed_by);

}  // namespace ddp::train
