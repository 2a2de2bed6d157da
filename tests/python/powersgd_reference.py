"""PyTorch's own powerSGD_hook on known gradients: the reference for tests/integration/
powersgd_worker.cpp, which runs ours on the same inputs and compares.

One rank of a gloo job started with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). For each configuration below it feeds the hook two buckets per step for STEPS
steps, this rank's gradients drawn from a seeded generator, and saves per step the buckets as
they went in and the hook's results:

    python3 powersgd_reference.py OUT_DIR      ->  OUT_DIR/rank<r>.pt

The file holds {"configs": [{"rank", "start", "warm_start", "error_feedback", "steps":
[{"inputs": [bucket0, bucket1], "outputs": [...]}]}], "shapes": [[shape, ...], [...]]}.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

STEPS = 5
START = 2  # two steps of plain all-reduce, then PowerSGD (the first with fresh Q's)
# Per bucket, its gradients' shapes. Bucket 0 is reduced first, as in DDP. Two [32, 16] in
# bucket 1 test the grouping by shape; [16] and [10] stay uncompressed (1-D); [6, 3, 4] is a
# 6 x 12 matrix, compressed at rank 1 and not at rank 3.
SHAPES = [[[10, 32], [10]], [[32, 16], [16], [6, 3, 4], [32, 16], [40, 40]]]
# (matrix_approximation_rank, warm_start, use_error_feedback): rank 3 orthogonalises by QR.
CONFIGS = [(1, True, True), (3, False, True), (2, True, False)]


class Bucket:
    """What powerSGD_hook reads of a dist.GradBucket."""

    def __init__(self, index, count, buffer, shapes):
        self._index, self._count, self._buffer = index, count, buffer
        self._gradients, offset = [], 0
        for shape in shapes:
            n = torch.Size(shape).numel()
            self._gradients.append(buffer[offset:offset + n].view(shape))
            offset += n

    def index(self):
        return self._index

    def is_last(self):
        return self._index == self._count - 1

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._gradients


def run_config(rank, config_index, approximation_rank, warm_start, error_feedback):
    state = powersgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=approximation_rank,
                                   start_powerSGD_iter=START, warm_start=warm_start,
                                   use_error_feedback=error_feedback, random_seed=0)
    steps = []
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(10000 * config_index + 100 * step + rank)
        inputs, outputs = [], []
        for index, shapes in enumerate(SHAPES):
            numel = sum(torch.Size(s).numel() for s in shapes)
            buffer = torch.randn(numel, generator=generator)
            inputs.append(buffer.clone())
            result = powersgd.powerSGD_hook(state, Bucket(index, len(SHAPES), buffer, shapes))
            outputs.append(result.wait().clone())
        steps.append({"inputs": inputs, "outputs": outputs})
    return {"rank": approximation_rank, "start": START, "warm_start": warm_start,
            "error_feedback": error_feedback, "steps": steps}


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    # Debian 13's PyTorch 2.6 is built without libuv, which its TCPStore asks for by default.
    os.environ.setdefault("USE_LIBUV", "0")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    configs = [run_config(rank, i, *c) for i, c in enumerate(CONFIGS)]
    torch.save({"configs": configs, "shapes": SHAPES},
               os.path.join(out_dir, "rank{}.pt".format(rank)))
    # Every rank has written before any leaves: a gloo peer that exits while another still
    # talks to it makes that one abort.
    dist.barrier()
    print("rank {}: {} configurations written".format(rank, len(configs)))


if __name__ == "__main__":
    main()
