#!/usr/bin/python3
"""What TORCH_DISTRIBUTED_DEBUG=DETAIL costs, ours against PyTorch's (both on gloo, 2 ranks, one
thread per rank, this host).

Per collective: ddp_bench_allreduce and bench/allreduce_reference.py, each with and without
DETAIL, per message size; the cost is the time with DETAIL minus the time without (us), within
a round. On the MLP's step: ddp_train (the MLP on Fashion-MNIST, one epoch, batch 64 per rank)
and bench/ddp_reference.py, each with and without DETAIL; the cost is 1 - samples/s with DETAIL /
samples/s without. Each round runs the eight jobs in an order that alternates between rounds.
Prints Markdown tables for docs/reliability.md.
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
PYTHON = "/usr/bin/python3"


def with_detail(on):
    return {"TORCH_DISTRIBUTED_DEBUG": "DETAIL" if on else "OFF"}


def allreduce_times(cmd, detail, world):
    """Rank 0's table as {bytes: time in us}."""
    times = {}
    for line in env_job(cmd, world, timeout=600, extra_env=with_detail(detail)).splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            times[int(fields[0])] = float(fields[2])
    return times


def mlp_samples_per_s(binary, detail, world):
    if binary == "python":
        out = env_job([PYTHON, os.path.join(HERE, "ddp_reference.py"), "--threads", "1"], world,
                      extra_env=with_detail(detail))
        return json.loads(out.splitlines()[-1])["samples_per_s"]
    with tempfile.TemporaryDirectory() as out_dir:
        env_job([binary, "--config", os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml"),
                 "--epochs", "1", "--threads", "1", "--output-dir", out_dir, "--log-level", "warn",
                 "--eval-every", "0", "--backend", "gloo"], world, extra_env=with_detail(detail))
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            return json.loads(f.readline())["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    sizes = ["--min-bytes", "4", "--max-bytes", str(4 << 20), "--factor", "32",
             "--iters", str(args.iters), "--warmup", "20"]
    impls = {"ddp": [os.path.join(args.build, "ddp_bench_allreduce"), "--backend", "gloo"] + sizes,
             "PyTorch": [PYTHON, os.path.join(HERE, "allreduce_reference.py"), "--backend", "gloo"] + sizes}
    trainers = {"ddp": os.path.join(args.build, "ddp_train"), "PyTorch": "python"}
    costs = {name: {} for name in impls}       # bytes -> [us]
    base = {name: {} for name in impls}        # bytes -> [us without DETAIL]
    step_costs = {name: [] for name in impls}  # [fraction]
    for r in range(args.rounds):
        order = list(impls) if r % 2 == 0 else list(impls)[::-1]
        for name in order:
            runs = [False, True] if r % 2 == 0 else [True, False]
            t = {on: allreduce_times(impls[name], on, args.world) for on in runs}
            for size in t[False]:
                costs[name].setdefault(size, []).append(t[True][size] - t[False][size])
                base[name].setdefault(size, []).append(t[False][size])
            s = {on: mlp_samples_per_s(trainers[name], on, args.world) for on in runs}
            step_costs[name].append(1 - s[True] / s[False])
        print(f"round {r} done", file=sys.stderr)

    med = statistics.median
    print(f"| bytes | ddp without (us) | ddp: DETAIL adds (us) | PyTorch without (us) | "
          f"PyTorch: DETAIL adds (us) |")
    print("|---|---|---|---|---|")
    for size in sorted(costs["ddp"]):
        print(f"| {size} | {med(base['ddp'][size]):.0f} | {med(costs['ddp'][size]):.0f} | "
              f"{med(base['PyTorch'][size]):.0f} | {med(costs['PyTorch'][size]):.0f} |")
    print()
    print("| MLP step, 2 ranks | DETAIL costs (median) | min-max |")
    print("|---|---|---|")
    for name, c in step_costs.items():
        print(f"| {name} | {med(c) * 100:.1f}% | {min(c) * 100:.1f}% to {max(c) * 100:.1f}% |")


if __name__ == "__main__":
    main()
