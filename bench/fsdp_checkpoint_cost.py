#!/usr/bin/python3
"""The training time a checkpoint costs under ddp_train --fsdp: gathered and written by rank 0
while every rank waits (the default), against --checkpoint-sharded (each rank copies its shard,
then writes it on a thread of its own while training goes on).

Each run trains `--epochs` epochs of the wide MLP (Adam, batch 16 per rank, one thread per rank)
on `--world` ranks under the launcher, checkpointing after every epoch or only after the last;
the cost of one checkpoint is the difference of the two runs' wall times (measured from outside)
over the epochs - 1 extra checkpoints. Both modes in interleaved rounds; the median per mode.
What a background write costs is what its thread takes from the training (here two ranks and a
writer each share the machine's cores) and the copy; what a synchronous one costs is all of it.

  bench/fsdp_checkpoint_cost.py --build build --rounds 2
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(args, sharded, every):
    with tempfile.TemporaryDirectory(dir=args.dir) as out:
        cmd = [os.path.join(args.build, "launcher"), "--nproc", str(args.world),
               os.path.join(args.build, "ddp_train"), "--model", "wide-mlp", "--width",
               str(args.width), "--depth", str(args.depth), "--optimizer", "adam", "--lr", "0.0001",
               "--dataset", "fashion-mnist", "--epochs", str(args.epochs), "--batch-size", "16",
               "--train-subset", str(args.samples_per_rank * args.world), "--test-subset", "16",
               "--threads", "1", "--progress", "off", "--device", "cpu", "--output-dir", out,
               "--fsdp", "--save-every", str(every), "--keep-last", "2"]
        if sharded:
            cmd.append("--checkpoint-sharded")
        start = time.monotonic()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.monotonic() - start
        if r.returncode != 0:
            sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
        sizes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
        return seconds, sizes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--samples-per-rank", type=int, default=64)
    p.add_argument("--dir", default=None, help="where the runs write (default: the system's temp)")
    args = p.parse_args()
    modes = {"gathered, synchronous": False, "sharded, background": True}
    walls = {(m, e): [] for m in modes for e in (0, 1)}
    for _ in range(args.rounds):
        for mode, sharded in modes.items():
            for every in (0, 1):
                seconds, _ = run(args, sharded, every)
                walls[(mode, every)].append(seconds)
    params = args.depth * (args.width * args.width + args.width)
    print(f"wide MLP {args.width} x {args.depth} (~{params / 1e6:.0f} M parameters), "
          f"{args.world} ranks, {args.epochs} epochs of {args.samples_per_rank // 16} steps, "
          f"{args.rounds} rounds")
    print("| checkpoints | wall, one at the end (s) | wall, every epoch (s) | "
          "cost of one checkpoint (s) |")
    print("|---|---|---|---|")
    for mode in modes:
        end, every = (statistics.median(walls[(mode, e)]) for e in (0, 1))
        cost = (every - end) / (args.epochs - 1)
        print(f"| {mode} | {end:.1f} | {every:.1f} | {cost:.2f} |")


if __name__ == "__main__":
    main()
