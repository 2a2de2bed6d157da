#!/usr/bin/python3
"""Each rank's memory (PSS) while training on one host with shared memory: this build against
another (an earlier commit's, built elsewhere), interleaved rounds.

PSS (/proc/<pid>/smaps_rollup) divides each page among the processes that map it, so memory that
both ranks map (a shared-memory segment) counts half to each, and private memory whole: their sum
is the job's memory. Every 50 ms every rank's PSS is read; a run's figure is the peak of their
sum divided by the ranks, and the median of that over the run (samples taken while every rank
runs: once one has ended, the pages it shared count whole to the others). The
workloads: one epoch of the MLP on Fashion-MNIST (batch 64 per rank, 1 thread per rank) and an
epoch of ResNet-18 on the first --resnet-samples images (memory is the model's, its gradients'
and its buckets', reached in the first steps; the whole epoch is not needed for it).

  bench/shm_memory.py --builds build /work/old/build --rounds 3 [--world 2]
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import children, proc_kb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKLOADS = {
    "mlp": ["--config", os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml")],
    "resnet18": ["--config", os.path.join(ROOT, "configs", "fashion_mnist_resnet18.yaml"),
                 "--batch-size", "32"],
}


def run(build, workload, args):
    """The mean over ranks of each rank's peak PSS (MB) in one run of `build`."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [os.path.join(build, "launcher"), "--nproc", str(args.world),
               os.path.join(build, "ddp_train"), *WORKLOADS[workload], "--epochs", "1",
               "--threads", "1", "--eval-every", "0", "--log-level", "warn", "--progress", "off",
               "--output-dir", out]
        if workload == "resnet18":
            cmd += ["--train-subset", str(args.resnet_samples)]
        launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
        sums = []
        while launcher.poll() is None:
            kbs = [proc_kb(pid, "smaps_rollup", "Pss:") for pid in children(launcher.pid)]
            # Only while every rank runs: a page that ranks share counts whole to the last one.
            if len(kbs) == args.world and None not in kbs:
                sums.append(sum(kbs))
            time.sleep(0.05)
        stderr = launcher.stderr.read()
        if launcher.returncode != 0 or not sums:
            raise SystemExit(f"{' '.join(cmd)}: exit {launcher.returncode}\n{stderr}")
        if "shared memory: rank" in stderr:  # a segment that did not fit: say so beside the figure
            print(stderr, file=sys.stderr)
        return max(sums) / args.world / 1024, statistics.median(sums) / args.world / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--builds", nargs=2, required=True, metavar=("THIS", "OTHER"),
                   help="two build directories (each with launcher and ddp_train)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--resnet-samples", type=int, default=192)
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = p.parse_args()
    mb = collections.defaultdict(list)  # (workload, build index) -> [(peak MB, median MB)]
    for r in range(args.rounds):
        for workload in args.workloads:
            for b in ([0, 1] if r % 2 == 0 else [1, 0]):
                mb[(workload, b)].append(run(args.builds[b], workload, args))
            print(f"round {r} {workload}: this {mb[(workload, 0)][-1]}, other "
                  f"{mb[(workload, 1)][-1]} MB (peak, median)", file=sys.stderr)
    print(f"| workload | figure | {args.builds[0]} (MB) | {args.builds[1]} (MB) | ratio (median) "
          "| min-max |")
    print("|---|---|---|---|---|---|")
    for workload in args.workloads:
        for k, figure in enumerate(["peak", "median"]):
            this = [m[k] for m in mb[(workload, 0)]]
            other = [m[k] for m in mb[(workload, 1)]]
            ratios = [a / b for a, b in zip(this, other)]
            print(f"| {workload} | {figure} | {statistics.median(this):.1f} | "
                  f"{statistics.median(other):.1f} | {statistics.median(ratios):.3f} | "
                  f"{min(ratios):.3f}-{max(ratios):.3f} |")

if __name__ == "__main__":
    main()
