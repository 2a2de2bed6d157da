#!/usr/bin/python3
"""Hierarchical against flat all-reduce across two hosts joined by a limited link.

Two hosts are two network namespaces on a bridge (as tests/support/netns.h makes them), each
side's egress limited with tc netem (rate and delay), e.g. 1 Gbit/s with 0.5 ms, 100 Mbit/s with
5 ms. On each host a launcher starts 2 ranks of ddp_train (--nnodes 2); a round trains the same
steps with --hierarchical auto (on: 2 hosts of 2 ranks) and with --hierarchical false, in an
order that alternates between rounds; the ratio is the global samples/s of the first over the
second, within a round. Needs root and iproute2 (ip, tc). Prints a Markdown table for
docs/benchmarks.md.

  bench/hierarchical_links.py --config configs/fashion_mnist_resnet18_cpu.yaml --train-subset 1280
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BRIDGE = "ddp-bench-br"
HOSTS = ["ddp-bench0", "ddp-bench1"]


def address(i):
    return f"10.214.0.{i + 1}"


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def remove_hosts():
    for ns in HOSTS:
        pids = ip("netns", "pids", ns, check=False).stdout.split()
        if pids:
            subprocess.run(["kill", "-9", *pids], check=False)
        ip("netns", "del", ns, check=False)
        ip("link", "del", ns + "-br", check=False)
    ip("link", "del", BRIDGE, check=False)


def make_hosts():
    remove_hosts()
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("link", "set", BRIDGE, "up")
    for i, ns in enumerate(HOSTS):
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", ns + "-br", "type", "veth", "peer", "name", ns, "netns", ns)
        ip("link", "set", ns + "-br", "master", BRIDGE, "up")
        ip("-n", ns, "addr", "add", address(i) + "/24", "dev", ns)
        ip("-n", ns, "link", "set", ns, "up")


def limit_link(rate, delay):
    """Each host's egress to the other: `rate` (tc's units, e.g. 100mbit) after `delay` (5ms).
    Where the kernel has no netem (this machine's has tbf only) the rate is set with tbf and the
    delay is left out, which the output says. Returns the delay applied ("" for none)."""
    applied = delay
    for ns in HOSTS:
        netem = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", ns, "root", "netem",
                 "rate", rate, "delay", delay]
        if subprocess.run(netem, capture_output=True).returncode == 0:
            continue
        # tbf: a bucket of at least one timer tick's worth of bytes at this rate (HZ 250 or less).
        bits = int(rate.lower().replace("gbit", "000000000").replace("mbit", "000000"))
        burst = max(32 * 1024, bits // 8 // 100)
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", ns, "root",
                        "tbf", "rate", rate, "burst", str(burst), "latency", "100ms"], check=True)
        applied = ""
    return applied


def train_job(args, out_dir, extra):
    """Both nodes' launchers of ddp_train (`args`: build, config, timeout) with `extra` options
    (after --log-level warn: a later one wins); exits on a failure. Returns node 0's output."""
    common = [os.path.join(args.build, "ddp_train"), "--config", os.path.join(ROOT, args.config),
              "--threads", "1", "--log-level", "warn", "--output-dir", out_dir, "--backend", "gloo",
              *extra]
    env = dict(os.environ, DDP_JOB_TOKEN="bench")
    env.pop("GLOO_SOCKET_IFNAME", None)  # gloo finds the interface that routes to the master
    procs = []
    for node, ns in enumerate(HOSTS):
        cmd = ["nsenter", f"--net=/run/netns/{ns}", os.path.join(args.build, "launcher"),
               "--nnodes", "2", "--node-rank", str(node), "--nproc", "2", "--master-addr",
               address(0), "--master-port", "29577", *common]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"training failed ({[p.returncode for p in procs]}):\n" + "\n".join(outs))
    return outs[0]


def train(args, hierarchical, out_dir):
    """One epoch on the first --train-subset images; the global samples/s (rank 0's metrics)."""
    train_job(args, out_dir, ["--epochs", "1", "--eval-every", "0", "--train-subset",
                              str(args.train_subset), "--hierarchical", hierarchical])
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--config", default="configs/fashion_mnist_resnet18_cpu.yaml")
    p.add_argument("--train-subset", type=int, default=1280)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--links", default="1gbit:0.5ms,100mbit:5ms",
                   help="RATE:DELAY,... (tc netem's units)")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("hierarchical_links: needs root (network namespaces, tc)")
    rows = []
    make_hosts()
    try:
        for link in args.links.split(","):
            rate, delay = link.split(":")
            delay = limit_link(rate, delay) or "none (no netem in this kernel)"
            ratios, tiered_all, flat_all = [], [], []
            for r in range(args.rounds):
                order = ["auto", "false"] if r % 2 == 0 else ["false", "auto"]
                got = {}
                for setting in order:
                    with tempfile.TemporaryDirectory() as out:
                        got[setting] = train(args, setting, out)
                tiered_all.append(got["auto"])
                flat_all.append(got["false"])
                ratios.append(got["auto"] / got["false"])
                print(f"{link} round {r}: hierarchical {got['auto']:.1f}, flat {got['false']:.1f} "
                      f"samples/s", file=sys.stderr)
            rows.append((rate, delay, statistics.median(tiered_all), statistics.median(flat_all),
                         statistics.median(ratios), min(ratios), max(ratios)))
    finally:
        remove_hosts()
    print("| link | delay | hierarchical samples/s | flat samples/s | ratio (median) | min-max |")
    print("|---|---|---|---|---|---|")
    for rate, delay, t, f, m, lo, hi in rows:
        print(f"| {rate} | {delay} | {t:.1f} | {f:.1f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")


if __name__ == "__main__":
    main()
