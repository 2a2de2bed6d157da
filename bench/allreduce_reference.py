#!/usr/bin/python3
"""PyTorch's own dist.all_reduce on gloo, timed exactly as ddp_bench_allreduce times ours.

Start it as the ranks of a job with torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Prints the same table as ddp_bench_allreduce on rank 0.
"""
import argparse
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--min-bytes", type=int, default=4096)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group(args.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# torch.distributed all_reduce: backend {args.backend}, {n} ranks, float32 sum, "
              f"{args.iters} iterations")
        print(f"{'bytes':>12} {'elements':>12} {'time(us)':>12} {'algbw':>10} {'busbw':>10}")
    size = args.min_bytes
    while size <= args.max_bytes:
        t = torch.ones(size // 4)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        local = (time.perf_counter() - start) / args.iters
        slowest = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.item()
        algbw = size / seconds / 1e9
        if rank == 0:
            print(f"{size:>12} {size // 4:>12} {seconds * 1e6:>12.1f} {algbw:>10.3f} "
                  f"{algbw * 2 * (n - 1) / n:>10.3f}")
        size *= args.factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
