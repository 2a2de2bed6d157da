#!/usr/bin/python3
"""ddp_bench_allreduce (gloo) against torch.distributed's all_reduce (gloo), same ranks and sizes.

Each round starts the job twice, ours and Python's (the order alternates between rounds), with
torchrun's env contract on this host, and takes per size the ratio Python time / our time
(above 1: ours is faster). Prints a Markdown table of the medians for docs/benchmarks.md.
"""
import argparse
import os
import statistics
import sys

from benchlib import env_job

HERE = os.path.dirname(os.path.abspath(__file__))


def run_job(cmd, world):
    """Rank 0's table as {bytes: time in us}."""
    times = {}
    for line in env_job(cmd, world, timeout=600).splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            times[int(fields[0])] = float(fields[2])
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(HERE, "..", "build", "ddp_bench_allreduce"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    ours_cmd = [args.binary, "--backend", "gloo"]
    python_cmd = ["/usr/bin/python3", os.path.join(HERE, "allreduce_reference.py"), "--backend", "gloo"]
    ours, theirs = {}, {}
    for r in range(args.rounds):
        jobs = [(ours, ours_cmd), (theirs, python_cmd)]
        for store, cmd in (jobs if r % 2 == 0 else jobs[::-1]):
            for size, t in run_job(cmd, args.world).items():
                store.setdefault(size, []).append(t)
        print(f"round {r} done", file=sys.stderr)
    print("| bytes | ddp time (us) | PyTorch time (us) | ratio PyTorch/ddp (median) | min-max |")
    print("|---|---|---|---|---|")
    for size in sorted(ours):
        ratios = [t / o for o, t in zip(ours[size], theirs[size])]
        print(f"| {size} | {statistics.median(ours[size]):.0f} | {statistics.median(theirs[size]):.0f} | "
              f"{statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f} |")


if __name__ == "__main__":
    main()
