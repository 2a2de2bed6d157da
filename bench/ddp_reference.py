#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel on gloo: the MLP on Fashion-MNIST, as ddp_train runs it.

Start it as the ranks of a job with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; world size 1 included). A DistributedSampler, a DataLoader with the per-rank batch,
DDP with its defaults, SGD with momentum. Rank 0 prints one JSON line per epoch with the global
training samples/s (all ranks' samples over the slowest rank's time), as ddp_train's metrics.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlp_reference import load, make_mlp, parse_args  # noqa: E402  (the same data and model)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    train_set = load(args.data, "train", args.train_subset)
    model = DDP(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        stats = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            samples = len(sampler) * world
            print(json.dumps({"epoch": epoch + 1, "samples_per_s": samples / stats.item(),
                              "epoch_seconds": stats.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
