#!/usr/bin/python3
"""--bucket-cap-mb auto against PyTorch's default 25 MiB across a limited link.

Two namespace hosts of 2 ranks each with tc on the link between them (bench/hierarchical_links.py
makes them). Per link: one run with --bucket-cap-mb auto says which size its first steps chose
(its log); then rounds of one epoch with that size and with 25 MiB, in an order that alternates
between rounds; the ratio is the first's global samples/s over the second's, within a round.
The model: by default an informer of 2.6 MiB of gradients in 18 tensors (5 candidate sizes; the
configuration of tests/integration's BucketTuning test, a longer epoch). Needs root and iproute2.

  bench/bucket_links.py --links 1gbit:0.5ms,100mbit:5ms --rounds 3
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

import hierarchical_links as hosts

INFORMER = ["--d-model", "256", "--d-ff", "1024", "--e-layers", "1", "--seq-len", "16",
            "--label-len", "8", "--pred-len", "4", "--batch-size", "4", "--first-bucket-mb", "0.5"]


def tuned_size(args):
    """The size --bucket-cap-mb auto keeps, and its log line (the trials' medians)."""
    with tempfile.TemporaryDirectory() as out:
        log = hosts.train_job(args, out, [*args.model, "--epochs", "1", "--eval-every", "0",
                                          "--train-subset", str(args.train_subset),
                                          "--bucket-cap-mb", "auto", "--log-level", "info"])
    kept = re.search(r"bucket-cap-mb auto: (?:keeps )?(\S+) MiB.*", log)
    if not kept:
        raise SystemExit("no size kept in the log:\n" + log)
    return kept.group(1), kept.group(0)


def samples_per_s(args, size):
    with tempfile.TemporaryDirectory() as out:
        hosts.train_job(args, out, [*args.model, "--epochs", "1", "--eval-every", "0",
                                    "--train-subset", str(args.train_subset),
                                    "--bucket-cap-mb", size])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return json.loads(f.readline())["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(hosts.ROOT, "build"))
    p.add_argument("--config", default="configs/informer_csv.yaml")
    p.add_argument("--model", nargs=argparse.REMAINDER, default=INFORMER,
                   help="options after --config (default: the informer above)")
    p.add_argument("--train-subset", type=int, default=1600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--links", default="1gbit:0.5ms,100mbit:5ms")
    p.add_argument("--timeout", type=int, default=3600)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bucket_links: needs root (network namespaces, tc)")
    rows = []
    hosts.make_hosts()
    try:
        for link in args.links.split(","):
            rate, delay = link.split(":")
            delay = hosts.limit_link(rate, delay) or "none (no netem in this kernel)"
            size, line = tuned_size(args)
            print(f"{link}: {line}", file=sys.stderr)
            ratios, tuned, default = [], [], []
            if size == "25":  # the default itself: nothing to compare
                rows.append((rate, delay, size, None, None, 1.0, 1.0, 1.0, line))
                continue
            for r in range(args.rounds):
                got = {}
                for setting in ([size, "25"] if r % 2 == 0 else ["25", size]):
                    got[setting] = samples_per_s(args, setting)
                tuned.append(got[size])
                default.append(got["25"])
                ratios.append(got[size] / got["25"])
                print(f"{link} round {r}: {size} MiB {got[size]:.1f}, 25 MiB {got['25']:.1f} "
                      f"samples/s", file=sys.stderr)
            rows.append((rate, delay, size, statistics.median(tuned), statistics.median(default),
                         statistics.median(ratios), min(ratios), max(ratios), line))
    finally:
        hosts.remove_hosts()
    print("| link | delay | size kept | its samples/s | 25 MiB samples/s | ratio (median) | min-max |")
    print("|---|---|---|---|---|---|---|")
    for rate, delay, size, t, d, m, lo, hi, _ in rows:
        if t is None:
            print(f"| {rate} | {delay} | 25 MiB (the default) | | | 1x | |")
        else:
            print(f"| {rate} | {delay} | {size} MiB | {t:.1f} | {d:.1f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")
    for row in rows:
        print(f"\n{row[0]}: {row[-1]}")


if __name__ == "__main__":
    main()
