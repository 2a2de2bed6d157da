#!/usr/bin/python3
"""The optimizer state each rank keeps with --zero (ZeRO-1), against the whole state that every
rank keeps without it: ResNet-18 on the CPU config with Adam, one step at world sizes 1, 2 and 4
(gloo, one thread per rank), the sizes read from the checkpoint, which holds each rank's
serialized shard (optimizer_shards) or the whole serialized state (optimizer_state). Prints a
Markdown table for docs/benchmarks.md.
"""
import argparse
import os
import tempfile

import torch

from benchlib import env_job

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(binary, world, zero, out_dir):
    cmd = [binary, "--config", os.path.join(ROOT, "configs", "fashion_mnist_resnet18_cpu.yaml"),
           "--train-subset", str(world * 8), "--batch-size", "8", "--epochs", "1",
           "--optimizer", "adam", "--lr", "0.001", "--threads", "1", "--output-dir", out_dir,
           "--log-level", "warn", "--progress", "off"] + (["--zero"] if zero else [])
    if world == 1:
        cmd += ["--backend", "local"]
    env_job(cmd, world, timeout=1800)
    c = torch.load(os.path.join(out_dir, "checkpoint.pt"))
    if zero:
        return [t.numel() for t in c["optimizer_shards"]]
    return [c["optimizer_state"].numel()]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ddp_train"))
    p.add_argument("--worlds", default="1,2,4")
    args = p.parse_args()
    print("| world | without --zero, per rank (MB) | with --zero, per rank (MB) | largest shard / whole |")
    print("|---|---|---|---|")
    for world in [int(w) for w in args.worlds.split(",")]:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            whole = run(args.binary, world, False, a)[0]
            shards = run(args.binary, world, True, b)
        mb = ", ".join(f"{s / 1e6:.2f}" for s in shards)
        print(f"| {world} | {whole / 1e6:.2f} | {mb} | {max(shards) / whole:.3f} |", flush=True)


if __name__ == "__main__":
    main()
