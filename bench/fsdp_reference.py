#!/usr/bin/python3
"""PyTorch's own FSDP: the MLP or the wide MLP on Fashion-MNIST, as ddp_train --fsdp runs them.

Start it as the ranks of a job with torchrun's env contract (gloo on cpu, nccl on cuda). The
models: the MLP (784-512-256-10), or the wide MLP (Flatten, `--depth` Linear layers `--width`
wide with ReLU, the head); their units are their Linear layers (FSDP2: each given to fully_shard,
then the root; FSDP1: a ModuleWrapPolicy on nn.Linear), as ddp_train's. A DistributedSampler, the
per-rank batch (kept in host memory, moved to --device per step, as ddp_train does), Adam, one
epoch; rank 0 prints one JSON line with the global training samples/s (all ranks' samples over
the slowest rank's time), as ddp_train's metrics.

PyTorch 2.6 (Debian 13's python3-torch) does not run FSDP on the CPU as shipped. The smallest
workarounds, each printed by rank 0 as "workaround: ..." where it is applied (on cpu only):
  FSDP2: the CPU stream has no record_event (nor wait_event), which FSDP2 calls after every
         collective: both added, as no-ops, since the CPU runs everything in order; the re-gather
         in backward fails autograd's in-place check, so reshard_after_forward=False; gloo's
         reduce-scatter sums where FSDP2 asks for ReduceOp.AVG (pytorch#162338: the gradients
         silently come out world times too large), so FSDP2 is made to sum and divide after, the
         path it takes for float16.
  FSDP1: refuses the CPU unless it is given device_id=torch.device("cpu").
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mlp_reference import load, make_mlp, parser  # noqa: E402  (the same data and MLP)


def parse_args():
    p = parser()
    p.set_defaults(lr=0.0001, batch_size=16)
    p.add_argument("--fsdp", choices=["1", "2"], default="2")
    p.add_argument("--model", choices=["mlp", "wide-mlp"], default="wide-mlp")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    return p.parse_args()


def make_wide_mlp(width, depth):
    layers = [nn.Flatten(), nn.Linear(784, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def say(text):
    if dist.get_rank() == 0:
        print(f"workaround: {text}", file=sys.stderr, flush=True)


def cpu_workarounds_for_fsdp2():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives
    torch.cpu.Stream.record_event = lambda self, event=None: torch.cpu.Event()
    torch.cpu.Stream.wait_event = lambda self, event: None
    say("torch.cpu.Stream.record_event and wait_event added as no-ops (FSDP2 calls them after "
        "each collective; the CPU stream has neither)")
    world = dist.get_world_size()
    _fsdp_collectives._get_gradient_divide_factors = lambda *args: (1.0, float(world))
    say(f"FSDP2's reduce-scatter made to sum and divide by {world} after (gloo sums where FSDP2 "
        "asks for ReduceOp.AVG: pytorch#162338)")
    say("reshard_after_forward=False (the re-gather in backward fails autograd's in-place check)")


def fsdp2(net, device):
    """FSDP2 without resharding after the forward (what the CPU allows; on cuda too, so that both
    devices run the same case)."""
    from torch.distributed.fsdp import fully_shard
    if device.type == "cpu":
        cpu_workarounds_for_fsdp2()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=False)
    return fully_shard(net, reshard_after_forward=False)


def fsdp1(net, device):
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    if device.type == "cpu":
        say('device_id=torch.device("cpu") (FSDP1 refuses the CPU without it)')
    return FullyShardedDataParallel(net, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                                    device_id=device)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    train_set = load(args.data, "train", args.train_subset)
    net = (make_mlp() if args.model == "mlp" else make_wide_mlp(args.width, args.depth)).to(device)
    model = fsdp2(net, device) if args.fsdp == "2" else fsdp1(net, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "samples_per_s": len(sampler) * world /
                              seconds.item(), "epoch_seconds": seconds.item(),
                              "last_loss": loss.item()}), flush=True)
    dist.barrier()  # no rank tears gloo down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
