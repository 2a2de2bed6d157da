#!/usr/bin/python3
"""The comm hooks side by side: ResNet-18 on the CPU config (configs/fashion_mnist_resnet18_cpu.yaml)
at world sizes 1, 4, 8 and 32 on gloo, one thread per rank, with --comm-hook allreduce, fp16, bf16
and powersgd (rank 4); --hooks picks some. Each run trains 2 epochs of STEPS steps per rank, batch
32 per rank; the figures are the second epoch's (PowerSGD starts after the first, so the second
is all compressed): its samples/s and the gradient bytes each rank handed to collectives per
step (metrics.jsonl: grad_bytes_per_step). Within a world size the hooks run in rotating order, for
`--rounds` rounds; the table has the medians. Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from benchlib import env_job

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS = 3
BATCH = 32
HOOKS = [["allreduce"], ["fp16"], ["bf16"],
         ["powersgd", "--powersgd-rank", "4", "--powersgd-start-iter", str(STEPS)]]


def run(binary, world, hook, out_dir):
    cmd = [binary, "--config", os.path.join(ROOT, "configs", "fashion_mnist_resnet18_cpu.yaml"),
           "--train-subset", str(world * BATCH * STEPS), "--batch-size", str(BATCH), "--epochs", "2",
           "--threads", "1", "--output-dir", out_dir, "--log-level", "warn", "--progress", "off",
           "--eval-every", "0", "--save-every", "0", "--comm-hook"] + hook
    if world == 1:
        cmd += ["--backend", "local"]
    env_job(cmd, world, timeout=1800)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        second = json.loads(f.readlines()[1])
    return second["samples_per_s"], second["grad_bytes_per_step"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ddp_train"))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--worlds", default="1,4,8,32")
    p.add_argument("--hooks", default="allreduce,fp16,bf16,powersgd")
    args = p.parse_args()
    hooks = [h for h in HOOKS if h[0] in args.hooks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in args.worlds.split(",")]:
            results = {h[0]: [] for h in hooks}
            for r in range(args.rounds):
                for k in range(len(hooks)):
                    hook = hooks[(k + r) % len(hooks)]
                    speed, wire = run(args.binary, world, hook, tmp)
                    print(f"world {world} {hook[0]} round {r}: {speed:.1f} samples/s, "
                          f"{wire:.0f} bytes/step", file=sys.stderr)
                    results[hook[0]].append((speed, wire))
            for name, runs in results.items():
                rows.append((world, name, statistics.median(s for s, _ in runs),
                             statistics.median(w for _, w in runs)))
    print("| world | --comm-hook | samples/s | gradient bytes per step and rank | vs allreduce |")
    print("|---|---|---|---|---|")
    for world, name, speed, wire in rows:
        plain = next(w for wo, n, _, w in rows if wo == world and n == "allreduce")
        share = f"{wire / plain:.3f}" if plain > 0 else "-"
        print(f"| {world} | {name} | {speed:.1f} | {wire / 1e6:.3f} MB | {share} |")


if __name__ == "__main__":
    main()
