#!/usr/bin/python3
"""Each rank's memory under ddp_train --fsdp against DDP, measured from outside, and its speed.

A run's figure for a rank: its peak RSS (VmRSS of /proc/<pid>/status, read every 20 ms) minus the
peak RSS of the same rank in the same run with the model's hidden layers 16 wide (LibTorch, the
data, the group, the loader: everything but the model). Two peaks: while training and evaluating
(until rank 0 logs the epoch's line), and to the process's end, which includes the checkpoint and
model.pt that follow; then a second run that resumes from that checkpoint for another epoch, its
peak over the whole run (the resume, the epoch, its checkpoint). The bound holds for all three. Backend mpi under mpirun for both (Open MPI
moves the bytes between the tensors given: a collective holds no copy of them), or gloo under the
launcher (whose all-gather and all-to-all stage a whole copy of the gathered tensor); not shm,
whose buffers are shared pages that each rank's RSS counts whole.

The workload: one epoch of a wide MLP (Flatten, `--depth` Linear layers `--width` wide, the head)
with Adam on the first samples of Fashion-MNIST, batch 16 per rank, one thread per rank; its
units are its Linear layers, the largest width x width + width parameters. The bound the FSDP
figure is held to: DDP's / N + 3 x the largest unit's parameters (float32) + 10 %. ResNet-18
beside it (its units: the residual blocks).

Speed: samples/s of the run (metrics.jsonl), FSDP against DDP at each world size, interleaved
rounds.

  bench/fsdp_memory.py --build build --worlds 2 4 --rounds 2
  bench/fsdp_memory.py --models wide-mlp --worlds 2 --fsdp-args=--checkpoint-sharded
  bench/fsdp_memory.py --models wide-mlp --worlds 2 4 \
      "--fsdp-args=--checkpoint-sharded --checkpoint-async false"
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import descendants, proc_kb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rank_of(pid):
    """The rank of a ddp_train process (RANK from the launcher, OMPI_COMM_WORLD_RANK from
    mpirun); None for any other process."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "ddp_train":
                return None
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                for key in (b"RANK=", b"OMPI_COMM_WORLD_RANK="):
                    if entry.startswith(key):
                        return int(entry[len(key):])
    except OSError:
        pass
    return None


def epoch_line_time(output):
    """When rank 0 logged the last epoch's line (after training and evaluation, before the
    checkpoint): the wall time in its log line, "[2026-11-28 21:06:26.585]" (local time)."""
    for line in output.splitlines():
        match = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\].*epoch (\d+)/\2:", line)
        if match:
            return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    raise SystemExit("no epoch line in the run's output:\n" + output)


def workload_args(args, model, width):
    if model == "wide-mlp":
        return ["--model", "wide-mlp", "--width", str(width), "--depth", str(args.depth),
                "--optimizer", "adam", "--lr", "0.0001"]
    return ["--config", os.path.join(ROOT, "configs", "fashion_mnist_resnet18_cpu.yaml")]


def peaks(cmd, world):
    """Runs `cmd` (the ranks under mpirun or the launcher) until it exits, reading each rank's RSS
    all along. Returns the ranks' peaks in MB (rank order), until rank 0's last epoch line and to
    the end, and the run's output."""
    with tempfile.TemporaryFile("w+") as log:
        launcher = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        samples, ranks = [], {}  # (wall time, pid, kB); pid -> rank (None: not a rank)
        while launcher.poll() is None:
            for pid in descendants(launcher.pid):
                if pid not in ranks:
                    ranks[pid] = rank_of(pid)
                kb = proc_kb(pid, "status", "VmRSS:") if ranks[pid] is not None else None
                if kb is not None:
                    samples.append((time.time(), pid, kb))
            time.sleep(0.02)
        log.seek(0)
        output = log.read()
    if launcher.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {launcher.returncode}\n{output}")
    trained = epoch_line_time(output)
    peak_train, peak_all = {}, {}
    for at, pid, kb in samples:
        peak_all[pid] = max(peak_all.get(pid, 0), kb)
        if at < trained:
            peak_train[pid] = max(peak_train.get(pid, 0), kb)
    if len(peak_all) != world:
        raise SystemExit(f"{' '.join(cmd)}: {len(peak_all)} ranks seen, not {world}\n{output}")
    pids = sorted(peak_all, key=lambda pid: ranks[pid])
    return [peak_train[p] / 1024 for p in pids], [peak_all[p] / 1024 for p in pids], output


def run(args, model, world, fsdp, width):
    """One run of an epoch and its checkpoint, then a second that resumes from it for one more:
    each rank's peak RSS in MB (training; to the end, with the checkpoint and model.pt; the whole
    resumed run) and the first run's samples/s."""
    with tempfile.TemporaryDirectory() as out:
        samples = args.samples_per_rank * world
        if args.backend == "mpi":
            start = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl",
                     "self,vader", "-np", str(world)]
        else:
            start = [os.path.join(args.build, "launcher"), "--nproc", str(world)]
        cmd = [*start, os.path.join(args.build, "ddp_train"), *workload_args(args, model, width),
               "--dataset", "fashion-mnist", "--epochs", "1", "--batch-size", "16",
               "--train-subset", str(samples), "--test-subset", "64", "--threads", "1",
               "--backend", args.backend, "--progress", "off", "--device", "cpu", "--output-dir", out]
        if fsdp:
            cmd += ["--fsdp", *(word for arg in args.fsdp_args for word in arg.split())]
        train, total, _ = peaks(cmd, world)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            speed = json.loads(f.readlines()[-1])["samples_per_s"]
        _, resumed, output = peaks(cmd + ["--epochs", "2", "--resume", "auto"], world)
        if "resum" not in output.lower():
            raise SystemExit("the second run did not resume:\n" + output)
        return train, total, resumed, speed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--samples-per-rank", type=int, default=64)
    p.add_argument("--models", nargs="*", default=["wide-mlp", "resnet18"])
    p.add_argument("--backend", choices=["mpi", "gloo"], default="mpi",
                   help="mpi: the ranks under mpirun; gloo: under the launcher")
    p.add_argument("--fsdp-args", nargs="*", default=[],
                   help="more ddp_train arguments for the FSDP runs (--checkpoint-sharded); one may "
                        "hold several, split at spaces")
    args = p.parse_args()
    unit_mb = (args.width * args.width + args.width) * 4 / 2**20
    print(f"| model | ranks | DDP MB/rank (train, +checkpoint, +resume) | FSDP MB/rank (train, "
          f"+checkpoint, +resume) | FSDP bound (DDP's train / N + 3 x {unit_mb:.0f} MB + 10 %) "
          f"| FSDP/DDP samples/s |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        for world in args.worlds:
            figures = {True: [], False: []}
            ratios = []
            for r in range(args.rounds):
                speeds = {}
                for fsdp in ([False, True] if r % 2 == 0 else [True, False]):
                    base = run(args, "wide-mlp", world, fsdp, 16)
                    measured = run(args, model, world, fsdp, args.width)
                    speeds[fsdp] = measured[3]
                    # Each phase's largest figure over the ranks, and each rank's.
                    per_rank = [[round(m - b) for m, b in zip(measured[k], base[k])]
                                for k in range(3)]
                    figures[fsdp].append([max(ranks) for ranks in per_rank])
                    print(f"round {r} {model} {world} ranks fsdp={fsdp}: each rank's MB "
                          f"{per_rank[0]} training, {per_rank[1]} with the checkpoint, "
                          f"{per_rank[2]} resumed; {speeds[fsdp]:.1f} samples/s", file=sys.stderr)
                ratios.append(speeds[True] / speeds[False])
            ddp = [statistics.median(f[k] for f in figures[False]) for k in range(3)]
            fsdp = [statistics.median(f[k] for f in figures[True]) for k in range(3)]
            bound = (ddp[0] / world + 3 * unit_mb) * 1.1
            verdict = f"{bound:.0f} ({'met' if max(fsdp) <= bound else 'NOT met'})" \
                if model == "wide-mlp" else "-"
            print(f"| {model} | {world} | {', '.join(f'{x:.0f}' for x in ddp)} "
                  f"| {', '.join(f'{x:.0f}' for x in fsdp)} | {verdict} "
                  f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
