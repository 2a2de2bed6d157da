#!/usr/bin/python3
"""Elastic training (--elastic under launcher --nnodes 1:1), measured two ways on the Fashion-MNIST
MLP (gloo, one thread per rank, batch 32 per rank unless --batch):

1. Recovery: one worker of a world of 3 or 4 is SIGKILLed after a step (the tests' ddp_fault_train,
   no restart); the time from the SIGKILL (the fault's log line) to the first step the smaller
   group commits (rank 0's "elastic: step N committed ..." line), both stamped by the same clock.
   Also the part of it the survivors spent re-forming (from the change seen to that commit).
2. Cost without a failure: samples/s of --elastic against the same plain launch, in interleaved
   rounds, as ratios within a round (one store vote per step is what --elastic adds).

Prints Markdown tables for docs/reliability.md. Needs a build with tests (ddp_fault_train).
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]"


def stamp(text):
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")


BATCH = 32  # per rank; --batch sets it


def mlp_args(out_dir, epochs, subset):
    return ["--config", os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml"),
            "--train-subset", str(subset), "--batch-size", str(BATCH), "--epochs", str(epochs),
            "--threads", "1", "--progress", "off", "--output-dir", out_dir]


def launch(build, launch_opts, program, args, timeout=600):
    cmd = [os.path.join(build, "launcher")] + launch_opts + [os.path.join(build, program)] + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    return r.stdout


def recovery(build, world, rank, step):
    """Seconds from the SIGKILL to the first committed step after it, and of it the re-forming."""
    with tempfile.TemporaryDirectory() as out:
        log = launch(build, ["--nnodes", "1:1", "--nproc", str(world)], "ddp_fault_train",
                     mlp_args(out, 2, BATCH * world * 20) +
                     ["--elastic", "--fault", "kill", "--fault-rank", str(rank),
                      "--fault-after-step", str(step)])
    kill = re.search(STAMP + r" .*fault: SIGKILL", log)
    commit = re.search(STAMP + r" .*elastic: step \d+ committed by generation \d+ of \d+ rank\(s\), "
                       r"([0-9.]+) s after the change was seen", log)
    if not kill or not commit:
        sys.exit(f"no fault or commit line in the log of world {world}:\n{log[-3000:]}")
    return (stamp(commit.group(1)) - stamp(kill.group(1))).total_seconds(), float(commit.group(2))


def samples_per_s(build, world, elastic, epochs):
    """The median samples/s of the epochs after the first (warm-up)."""
    with tempfile.TemporaryDirectory() as out:
        opts = ["--nnodes", "1:1"] if elastic else []
        launch(build, opts + ["--nproc", str(world)], "ddp_train",
               mlp_args(out, epochs, BATCH * world * 60) + (["--elastic"] if elastic else []))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f]
    return statistics.median(m["samples_per_s"] for m in lines[1:])


def main():
    global BATCH
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--worlds", default="3,4")
    p.add_argument("--kills", type=int, default=5, help="kills per world size")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the cost")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--only", choices=["recovery", "cost"], help="one of the two measurements")
    p.add_argument("--batch", type=int, default=32, help="batch per rank")
    args = p.parse_args()
    BATCH = args.batch
    worlds = [int(w) for w in args.worlds.split(",")]
    if args.only != "cost":
        recovery_table(args, worlds)
    if args.only != "recovery":
        cost_table(args, worlds)


def recovery_table(args, worlds):

    print("| world | kills | SIGKILL to the first committed step: median (min-max) s | "
          "of it, re-forming: median s |")
    print("|---|---|---|---|")
    for world in worlds:
        runs = [recovery(args.build, world, k % world, 3 + 4 * k) for k in range(args.kills)]
        for k, (total, reform) in enumerate(runs):
            print(f"world {world} kill {k}: {total:.3f} s ({reform:.3f} s re-forming)",
                  file=sys.stderr)
        totals = [t for t, _ in runs]
        print(f"| {world} | {len(runs)} | {statistics.median(totals):.3f} "
              f"({min(totals):.3f}-{max(totals):.3f}) | "
              f"{statistics.median(r for _, r in runs):.3f} |")


def cost_table(args, worlds):
    print()
    print("| world | plain samples/s | --elastic samples/s | ratio: median (min-max) |")
    print("|---|---|---|---|")
    for world in worlds:
        plain, elastic, ratios = [], [], []
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            got = {e: samples_per_s(args.build, world, e, args.epochs) for e in order}
            plain.append(got[False])
            elastic.append(got[True])
            ratios.append(got[True] / got[False])
            print(f"world {world} round {r}: plain {got[False]:.0f} elastic {got[True]:.0f} "
                  f"ratio {ratios[-1]:.3f}", file=sys.stderr)
        print(f"| {world} | {statistics.median(plain):.0f} | {statistics.median(elastic):.0f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")


if __name__ == "__main__":
    main()
