#!/usr/bin/python3
"""Single-process MLP epoch: ddp_train against Python PyTorch, interleaved rounds, as ratios.

Each round runs both programs once per thread count (the order alternates between rounds),
reads each one's training samples/s for one epoch, and takes the ratio within the round.
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchlib import interleaved_rounds

HERE = os.path.dirname(os.path.abspath(__file__))


def run_cpp(binary, threads, out_dir):
    subprocess.run([binary, "--config", os.path.join(HERE, "..", "configs", "fashion_mnist_mlp.yaml"),
                    "--epochs", "1", "--threads", str(threads), "--output-dir", out_dir,
                    "--log-level", "warn"], check=True)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())["samples_per_s"]


def run_python(threads):
    out = subprocess.run([sys.executable, os.path.join(HERE, "mlp_reference.py"), "--threads",
                          str(threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(HERE, "..", "build", "ddp_train"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", default="1,2")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for threads in [int(t) for t in args.threads.split(",")]:
            rows.append((threads,) + interleaved_rounds(lambda: run_cpp(args.binary, threads, tmp),
                                                        lambda: run_python(threads), args.rounds,
                                                        f"threads {threads}"))
    print("| threads | ddp_train samples/s | PyTorch samples/s | ratio (median) | ratio (min-max) |")
    print("|---|---|---|---|---|")
    for t, c, p_, m, lo, hi in rows:
        print(f"| {t} | {c:.0f} | {p_:.0f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")


if __name__ == "__main__":
    main()
