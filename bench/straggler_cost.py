#!/usr/bin/python3
"""The straggler attribution's cost on a balanced job: the MLP's epoch at 2 ranks on gloo (the env
contract, 1 thread each) with the attribution on (the defaults: the step times exchanged every
50 steps) against off (--straggler-threshold 0), in interleaved rounds, as ratios of samples/s.
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import tempfile

from benchlib import env_job, interleaved_rounds

HERE = os.path.dirname(os.path.abspath(__file__))


def run(binary, out_dir, epochs, extra):
    env_job([binary, "--config", os.path.join(HERE, "..", "configs", "fashion_mnist_mlp.yaml"),
             "--epochs", str(epochs), "--threads", "1", "--output-dir", out_dir,
             "--log-level", "warn", "--save-every", "0"] + extra, 2)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    return sum(m["samples_per_s"] for m in lines) / len(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(HERE, "..", "build", "ddp_train"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--every", default="50")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        on = lambda: run(args.binary, tmp, args.epochs, ["--straggler-every", args.every])
        off = lambda: run(args.binary, tmp, args.epochs, ["--straggler-threshold", "0"])
        a, b, m, lo, hi = interleaved_rounds(on, off, args.rounds, "straggler")
    print("| straggler attribution | samples/s on | samples/s off | on/off (median) | on/off (min-max) |")
    print("|---|---|---|---|---|")
    print(f"| every {args.every} steps | {a:.0f} | {b:.0f} | {m:.3f} | {lo:.3f}-{hi:.3f} |")


if __name__ == "__main__":
    main()
