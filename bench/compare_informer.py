#!/usr/bin/python3
"""ddp_train against PyTorch's Python DDP (gloo): Informer on a time-series CSV, one epoch, batch
32 per rank, one thread per rank, interleaved rounds (alternating which runs first), ratios
within a round.

Ours runs as ddp_train with configs/informer_csv.yaml (world 1: the local backend, as a plain run;
world 2 and up: ranks started with the env contract on gloo); Python's as
bench/informer_reference.py with the env contract and the same model and data options (its
defaults are the config's). The CSV is any file in the ETT layout, e.g. one written by
scripts/make_timeseries_csv. Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import tempfile

from benchlib import env_job, interleaved_rounds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def ours(binary, data, world, out_dir):
    cmd = [binary, "--config", os.path.join(ROOT, "configs", "informer_csv.yaml"), "--data", data,
           "--epochs", "1", "--threads", "1", "--output-dir", out_dir, "--log-level", "warn",
           "--eval-every", "0"]
    if world == 1:
        subprocess.run(cmd, check=True)
    else:
        env_job(cmd + ["--backend", "gloo"], world)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())["samples_per_s"]


def python(data, world):
    out = env_job(["/usr/bin/python3", os.path.join(HERE, "informer_reference.py"), "--data", data,
                   "--epochs", "1", "--threads", "1"], world)
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ddp_train"))
    p.add_argument("--data", required=True, help="the CSV (scripts/make_timeseries_csv PATH writes one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worlds", default="1,2", help="comma-separated world sizes")
    args = p.parse_args()
    data = os.path.abspath(args.data)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in [int(w) for w in args.worlds.split(",")]:
            rows.append((world,) + interleaved_rounds(lambda: ours(args.binary, data, world, tmp),
                                                      lambda: python(data, world), args.rounds,
                                                      f"world {world}"))
    print("| world | ddp_train (backend) | ddp_train samples/s | PyTorch DDP gloo samples/s | ratio (median) | min-max |")
    print("|---|---|---|---|---|---|")
    for world, x, y, m, lo, hi in rows:
        print(f"| {world} | {'local' if world == 1 else 'gloo'} | {x:.1f} | {y:.1f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")


if __name__ == "__main__":
    main()
