#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel: the MLP (or d2l's ResNet-18) on Fashion-MNIST, as
ddp_train runs it.

Start it as the ranks of a job with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; world size 1 included). A DistributedSampler, a DataLoader with the per-rank batch,
DDP with its defaults, SGD (with momentum unless --momentum 0). The dataset stays in host memory
and each batch moves to --device per step, as ddp_train does; gloo on cpu, nccl on cuda; --amp
bf16 runs forward and loss under torch.autocast. Rank 0 prints one JSON line per epoch with the
global training samples/s (all ranks' samples over the slowest rank's time), as ddp_train's
metrics.
"""
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
from mlp_reference import load, make_mlp, parser  # noqa: E402  (the same data and model)
from checkpoint_interop import resnet18  # noqa: E402  (ddp's ResNet-18, module for module)


def parse_args():
    p = parser()
    p.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--amp", choices=["off", "bf16"], default="off")
    return p.parse_args()


def autocast(args):
    if args.amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=args.device, dtype=torch.bfloat16)


def train_epoch(args, model, opt, loader, device):
    """One epoch; returns its seconds on this rank (the device's queue drained)."""
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        with autocast(args):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if args.device == "cuda" \
        else torch.device("cpu")
    torch.manual_seed(args.seed)
    train_set = load(args.data, "train", args.train_subset)
    net = (make_mlp() if args.model == "mlp" else resnet18()).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        stats = torch.tensor([train_epoch(args, model, opt, loader, device)], dtype=torch.float64,
                             device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        if rank == 0:
            samples = len(sampler) * world
            print(json.dumps({"epoch": epoch + 1, "samples_per_s": samples / stats.item(),
                              "epoch_seconds": stats.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
