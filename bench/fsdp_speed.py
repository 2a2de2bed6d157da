#!/usr/bin/python3
"""ddp_train --fsdp against DDP on one host, samples/s, for one build or several side by side.

Each run: `launcher --nproc N ddp_train` on the wide MLP (Flatten, `--depth` Linear layers
`--width` wide, the head; its units are the Linear layers) with Adam, one epoch of
`--samples-per-rank` Fashion-MNIST samples a rank, batch 16 a rank, one thread per rank, on
`--backend` (shm: the units' gathers and reduce-scatters in the memory the ranks share). The
figure is the epoch's samples/s as ddp_train records it (metrics.jsonl: training only, no
evaluation). Rounds are interleaved: each round runs every build's DDP and FSDP once, in turn, so
that the machine's drift falls on all alike. Reported: the medians, FSDP / DDP within a build
(each round's ratio, median and range), and each build's FSDP against the first build's.

  bench/fsdp_speed.py --builds build --rounds 3
  bench/fsdp_speed.py --builds build /work/oldmain/build --rounds 3   # this tree against another
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from fsdp_memory import workload_args  # the wide MLP's options, as that bench runs it

HERE = os.path.dirname(os.path.abspath(__file__))


def samples_per_s(args, build, fsdp):
    """One run's samples/s (metrics.jsonl's last epoch)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [os.path.join(build, "launcher"), "--nproc", str(args.world),
               os.path.join(build, "ddp_train"), *workload_args(args, "wide-mlp", args.width),
               "--dataset", "fashion-mnist", "--epochs", "1", "--batch-size", "16",
               "--train-subset", str(args.samples_per_rank * args.world), "--test-subset", "16",
               "--threads", "1", "--backend", args.backend, "--progress", "off", "--device", "cpu",
               "--output-dir", out]
        if fsdp:
            cmd.append("--fsdp")
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return json.loads(f.readlines()[-1])["samples_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--builds", nargs="+", default=[os.path.join(os.path.dirname(HERE), "build")])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--samples-per-rank", type=int, default=256)
    parser.add_argument("--backend", default="shm", choices=["shm", "gloo"])
    args = parser.parse_args()
    speeds = {(b, f): [] for b in args.builds for f in (False, True)}
    for r in range(args.rounds):
        for build in args.builds:
            for fsdp in (False, True):
                speeds[(build, fsdp)].append(samples_per_s(args, build, fsdp))
                print(f"round {r + 1}: {build} {'FSDP' if fsdp else 'DDP'}: "
                      f"{speeds[(build, fsdp)][-1]:.1f} samples/s", flush=True)
    first = args.builds[0]
    print(f"\n{args.world} ranks, {args.backend}, wide MLP {args.depth} x {args.width}, "
          f"{args.rounds} rounds (medians)\n")
    print("| build | DDP samples/s | FSDP samples/s | FSDP / DDP (range) | FSDP / first build's |")
    print("|---|---|---|---|---|")
    for build in args.builds:
        ddp, fsdp = speeds[(build, False)], speeds[(build, True)]
        ratios = [f / d for f, d in zip(fsdp, ddp)]
        against = [f / g for f, g in zip(fsdp, speeds[(first, True)])]
        print(f"| {build} | {statistics.median(ddp):.1f} | {statistics.median(fsdp):.1f} "
              f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
              f"| {statistics.median(against):.2f} |")


if __name__ == "__main__":
    main()
