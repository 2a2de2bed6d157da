#!/usr/bin/python3
"""Minor page faults and CPU seconds per training step of ddp_train --fsdp against DDP.

The wide MLP of bench/fsdp_memory.py (Flatten, `--depth` Linear layers `--width` wide, the head;
Adam, batch 16 per rank, one thread per rank) under mpirun with --backend mpi. Each side runs
twice, `--short` and `--long` steps per rank; a step's figure is the difference of the two runs
over the difference of their steps, so that start-up, evaluation and the checkpoint cancel out.
Faults and CPU seconds are the kernel's count for the whole job (getrusage of the children: every
rank, and mpirun), divided by the ranks. Rounds alternate which side goes first; the table gives
medians and the FSDP/DDP ratio of the medians.

  bench/fsdp_page_faults.py --build build --worlds 2 4 --rounds 2
  bench/fsdp_page_faults.py --fsdp-args=--reshard-after-forward=false
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def job(args, world, steps, extra):
    """One job of `steps` steps per rank: (minor faults, CPU seconds) per rank."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
               "-np", str(world), os.path.join(args.build, "ddp_train"), "--model", "wide-mlp",
               "--width", str(args.width), "--depth", str(args.depth), "--optimizer", "adam",
               "--lr", "0.0001", "--dataset", "fashion-mnist", "--epochs", "1",
               "--batch-size", "16", "--train-subset", str(steps * 16 * world),
               "--test-subset", "16", "--threads", "1", "--backend", "mpi", "--progress", "off",
               "--device", "cpu", "--output-dir", out, *extra]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    faults = after.ru_minflt - before.ru_minflt
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return faults / world, cpu / world


def per_step(args, world, extra):
    short = job(args, world, args.short, extra)
    long = job(args, world, args.long, extra)
    steps = args.long - args.short
    return (long[0] - short[0]) / steps, (long[1] - short[1]) / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--short", type=int, default=4, help="steps per rank of the short run")
    p.add_argument("--long", type=int, default=16, help="steps per rank of the long run")
    p.add_argument("--fsdp-args", nargs="*", default=[],
                   help="more ddp_train arguments for the FSDP runs")
    args = p.parse_args()
    print("| ranks | DDP faults/step | FSDP faults/step | FSDP/DDP faults | DDP CPU s/step "
          "| FSDP CPU s/step | FSDP/DDP CPU |")
    print("|---|---|---|---|---|---|---|")
    for world in args.worlds:
        runs = {False: [], True: []}
        for r in range(args.rounds):
            for fsdp in ([False, True] if r % 2 == 0 else [True, False]):
                figure = per_step(args, world, ["--fsdp", *args.fsdp_args] if fsdp else [])
                runs[fsdp].append(figure)
                print(f"round {r} {world} ranks fsdp={fsdp}: {figure[0]:.0f} faults, "
                      f"{figure[1]:.3f} CPU s per step and rank", file=sys.stderr)
        ddp = [statistics.median(f[k] for f in runs[False]) for k in range(2)]
        fsdp = [statistics.median(f[k] for f in runs[True]) for k in range(2)]
        print(f"| {world} | {ddp[0]:,.0f} | {fsdp[0]:,.0f} | {fsdp[0] / ddp[0]:.2f} "
              f"| {ddp[1]:.2f} | {fsdp[1]:.2f} | {fsdp[1] / ddp[1]:.2f} |")


if __name__ == "__main__":
    main()
