#!/usr/bin/python3
"""Each rank's memory under ddp_train --fsdp against DDP, measured from outside, and its speed.

A run's figure for a rank: its peak RSS (VmRSS of /proc/<pid>/status, read every 20 ms) minus the
peak RSS of the same rank in the same run with the model's hidden layers 16 wide (LibTorch, the
data, the group, the loader: everything but the model). Two peaks: while training and evaluating
(until rank 0 logs the epoch's line), and including the checkpoint that follows (rank 0 gathers
the model and the optimizer state to write them). Backend gloo for both: the ranks' memory is
their own (shm's buffers are shared pages that each rank's RSS counts whole).

The workload: one epoch of a wide MLP (Flatten, `--depth` Linear layers `--width` wide, the head)
with Adam on the first samples of Fashion-MNIST, batch 16 per rank, one thread per rank; its
units are its Linear layers, the largest width x width + width parameters. The bound the FSDP
figure is held to: DDP's / N + 3 x the largest unit's parameters (float32) + 10 %. ResNet-18
beside it (its units: the residual blocks).

Speed: samples/s of the run (metrics.jsonl), FSDP against DDP at each world size, interleaved
rounds.

  bench/fsdp_memory.py --build build --worlds 2 4 --rounds 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def rank_of(pid):
    """The RANK in a process's environment (the launcher sets it), -1 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"RANK="):
                    return int(entry[5:])
    except OSError:
        pass
    return -1


def workload_args(args, model, width):
    if model == "wide-mlp":
        return ["--model", "wide-mlp", "--width", str(width), "--depth", str(args.depth),
                "--optimizer", "adam", "--lr", "0.0001"]
    return ["--config", os.path.join(ROOT, "configs", "fashion_mnist_resnet18_cpu.yaml")]


def run(args, model, world, fsdp, width):
    """One run: each rank's peak RSS in MB (training, with the checkpoint) and samples/s."""
    with tempfile.TemporaryDirectory() as out:
        samples = args.samples_per_rank * world
        cmd = [os.path.join(args.build, "launcher"), "--nproc", str(world),
               os.path.join(args.build, "ddp_train"), *workload_args(args, model, width),
               "--dataset", "fashion-mnist", "--epochs", "1", "--batch-size", "16",
               "--train-subset", str(samples), "--test-subset", "64", "--threads", "1",
               "--backend", "gloo", "--progress", "off", "--device", "cpu", "--output-dir", out]
        if fsdp:
            cmd.append("--fsdp")
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        trained = threading.Event()
        lines = []

        def read():
            for line in launcher.stdout:
                lines.append(line)
                if "epoch 1/1:" in line:
                    trained.set()

        reader = threading.Thread(target=read)
        reader.start()
        peak_train, peak_all, ranks = {}, {}, {}
        while launcher.poll() is None:
            during_training = not trained.is_set()
            for pid in children(launcher.pid):
                if pid not in ranks:
                    ranks[pid] = rank_of(pid)
                kb = rss_kb(pid)
                if kb is None:
                    continue
                peak_all[pid] = max(peak_all.get(pid, 0), kb)
                if during_training:
                    peak_train[pid] = max(peak_train.get(pid, 0), kb)
            time.sleep(0.02)
        reader.join()
        if launcher.returncode != 0 or len(peak_all) != world:
            raise SystemExit(f"{' '.join(cmd)}: exit {launcher.returncode}\n{''.join(lines)}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            speed = json.loads(f.readlines()[-1])["samples_per_s"]
        pids = sorted(peak_all, key=lambda pid: ranks[pid])
        return ([peak_train[p] / 1024 for p in pids], [peak_all[p] / 1024 for p in pids], speed)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--samples-per-rank", type=int, default=64)
    p.add_argument("--models", nargs="*", default=["wide-mlp", "resnet18"])
    args = p.parse_args()
    unit_mb = (args.width * args.width + args.width) * 4 / 2**20
    print(f"| model | ranks | DDP MB/rank (train, +checkpoint) | FSDP MB/rank (train, +checkpoint) "
          f"| FSDP bound (DDP/N + 3 x {unit_mb:.0f} MB + 10 %) | FSDP/DDP samples/s |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        for world in args.worlds:
            figures = {True: [], False: []}
            ratios = []
            for r in range(args.rounds):
                speeds = {}
                for fsdp in ([False, True] if r % 2 == 0 else [True, False]):
                    base_train, base_all, _ = run(args, "wide-mlp", world, fsdp, 16)
                    train, total, speeds[fsdp] = run(args, model, world, fsdp, args.width)
                    figures[fsdp].append((
                        max(t - b for t, b in zip(train, base_train)),
                        max(t - b for t, b in zip(total, base_all))))
                    print(f"round {r} {model} {world} ranks fsdp={fsdp}: each rank's MB "
                          f"{[round(t - b) for t, b in zip(train, base_train)]} training, "
                          f"{[round(t - b) for t, b in zip(total, base_all)]} with the "
                          f"checkpoint; {speeds[fsdp]:.1f} samples/s", file=sys.stderr)
                ratios.append(speeds[True] / speeds[False])
            ddp = [statistics.median(f[k] for f in figures[False]) for k in (0, 1)]
            fsdp = [statistics.median(f[k] for f in figures[True]) for k in (0, 1)]
            bound = (ddp[0] / world + 3 * unit_mb) * 1.1
            verdict = f"{bound:.0f} ({'met' if fsdp[0] <= bound else 'NOT met'})" \
                if model == "wide-mlp" else "-"
            print(f"| {model} | {world} | {ddp[0]:.0f}, {ddp[1]:.0f} | {fsdp[0]:.0f}, {fsdp[1]:.0f} "
                  f"| {verdict} "
                  f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
