"""PyTorch's own DDP with torch.distributed.algorithms.Join on uneven inputs: the reference for
tests/integration/join_worker.cpp, which trains ours on the same data and compares.

One rank of a gloo job started with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Rank r has 3 + 2r batches (3, 5, 7 on 3 ranks). The model is the DDP tests' net
(a: Linear(8, 32), relu, b: Linear(32, 32), relu, c: Linear(32, 4)), SGD with momentum 0.9 and
lr 0.1, mean squared error. Rank 0 writes every rank's batches, the initial weights and PyTorch's
final weights:

    python3 join_reference.py OUT_DIR      ->  OUT_DIR/join.pt

a flat dict: "init.<name>" and "final.<name>" for each parameter, "x.<rank>.<k>" and
"y.<rank>.<k>" for each batch.
"""

import faulthandler
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

BATCH, IN, HIDDEN, OUT = 6, 8, 32, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def batches(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(3 + 2 * rank)]


def main():
    out_dir = sys.argv[1]
    faulthandler.dump_traceback_later(90, exit=True)  # a hang ends with where it hung
    os.environ.setdefault("USE_LIBUV", "0")  # Debian 13's PyTorch is built without libuv
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100)
    net = Net()
    init = {k: v.clone() for k, v in net.state_dict().items()}
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Join([model]):
        for x, y in batches(rank):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    if rank == 0:
        out = {f"init.{k}": v for k, v in init.items()}
        out.update({f"final.{k}": v.detach().clone() for k, v in net.state_dict().items()})
        for r in range(world):
            for k, (x, y) in enumerate(batches(r)):
                out[f"x.{r}.{k}"], out[f"y.{r}.{k}"] = x, y
        torch.save(out, os.path.join(out_dir, "join.pt"))
    dist.barrier()
    # PyTorch 1.13's DDP, destroyed with its gloo group at the end, sometimes hangs there (about
    # one run in ten on this machine, at the frame that returns from main()): all work is done
    # and saved, so leave without the destructors.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
