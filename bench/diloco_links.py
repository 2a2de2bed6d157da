#!/usr/bin/python3
"""Time to accuracy across a slow link: DiLoCo against synchronous DDP.

Two namespace hosts of 2 ranks each with tc on the link between them (bench/hierarchical_links.py
makes them), the MLP on Fashion-MNIST (batch 64 per rank, one thread each), evaluated after every
epoch; for each setting, the training seconds (the epochs' sum, evaluation excluded) until the
test accuracy first reaches TARGET, and the last epoch's accuracy. With --sync-delay N, DiLoCo
also with its all-reduce overlapping the last N inner steps of each round. Settings in interleaved
rounds (the order rotates); the medians. Needs root and iproute2.

  bench/diloco_links.py --link 100mbit:5ms --epochs 4 --sync-every 50 [--sync-delay 25]
      [--rounds 3] [--settings diloco,diloco-delay]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

import hierarchical_links as hosts


def run(args, extra):
    with tempfile.TemporaryDirectory() as out:
        hosts.train_job(args, out, ["--epochs", str(args.epochs), "--eval-every", "1", *extra])
        with open(os.path.join(out, "metrics.jsonl")) as f:
            epochs = [json.loads(line) for line in f]
    seconds, reached = 0.0, None
    for e in epochs:
        seconds += e["epoch_seconds"]
        if reached is None and e["test_accuracy"] >= args.target:
            reached = seconds
    return reached, epochs[-1]["test_accuracy"], seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(hosts.ROOT, "build"))
    p.add_argument("--config", default="configs/fashion_mnist_mlp.yaml")
    p.add_argument("--link", default="100mbit:5ms")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--sync-every", type=int, default=50)
    p.add_argument("--sync-delay", type=int, default=0)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--settings", default="", help="comma-separated names (default: all)")
    p.add_argument("--timeout", type=int, default=3600)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("diloco_links: needs root (network namespaces, tc)")
    every = ["--sync-every", str(args.sync_every)]
    settings = {"ddp": ["--sync", "ddp"],
                "diloco": ["--sync", "diloco", *every],
                "local-sgd": ["--sync", "local-sgd", *every]}
    if args.sync_delay:
        settings["diloco-delay"] = ["--sync", "diloco", *every, "--sync-delay",
                                    str(args.sync_delay)]
    if args.settings:
        settings = {name: settings[name] for name in args.settings.split(",")}
    names = list(settings)
    got = collections.defaultdict(list)
    hosts.make_hosts()
    try:
        rate, delay = args.link.split(":")
        delay = hosts.limit_link(rate, delay) or "none (no netem in this kernel)"
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                reached, last, total = run(args, settings[name])
                print(f"round {r}: {name}: {args.target} after {reached} s, last accuracy {last}, "
                      f"{total:.1f} s", file=sys.stderr)
                got[name].append((reached, last, total))
    finally:
        hosts.remove_hosts()
    print(f"| {rate}, delay {delay} | seconds to {args.target} | accuracy after {args.epochs} "
          f"epochs | training seconds |")
    print("|---|---|---|---|")
    for name in names:
        reached = [g[0] for g in got[name]]
        shown = (f"{statistics.median(reached):.1f}" if None not in reached else
                 f"not reached in {reached.count(None)} of {len(reached)}")
        last = statistics.median(g[1] for g in got[name])
        total = statistics.median(g[2] for g in got[name])
        label = f"{name} ({args.sync_delay})" if name == "diloco-delay" else name
        print(f"| {label} | {shown} | {last:.4f} | {total:.1f} |")


if __name__ == "__main__":
    main()
