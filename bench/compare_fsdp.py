#!/usr/bin/python3
"""ddp_train --fsdp against PyTorch's own FSDP (FSDP2 and FSDP1): samples/s and each rank's peak
memory, read from outside, on the same data, model, units and optimizer.

The cases: the MLP and the wide MLP (`--width`, `--depth`), at each of `--worlds`, Adam, batch 16
a rank, `--samples-per-rank` Fashion-MNIST samples a rank, one epoch, one thread per rank; the units
are the Linear layers on both sides.
  - FSDP2 (fully_shard, reshard_after_forward=False: what PyTorch's CPU path allows) against
    ddp_train --fsdp --reshard-after-forward false;
  - FSDP1 (FullyShardedDataParallel, FULL_SHARD) against ddp_train --fsdp (which reshards after
    the forward, as FULL_SHARD does).
PyTorch's side is bench/fsdp_reference.py, started with torchrun's env contract (gloo on cpu,
nccl on cuda), with the workarounds PyTorch 2.6 needs on a CPU: its ranks print each one
("workaround: ..."), and so does this script, once. Ours: `launcher --nproc N ddp_train` on
--backend (shm on cpu; nccl on cuda), as users start it, with no workaround.

Rounds are interleaved (ours first in even rounds, PyTorch first in odd ones); a round's ratio is
ours / PyTorch's samples/s. Memory: each rank's peak proportional set size (Pss of
/proc/<pid>/smaps_rollup, read every 50 ms: pages shared between the ranks, as the shm backend's
segment, count once over them), the largest rank's, median over the rounds; with --device cuda
also each rank's GPU memory as nvidia-smi reports it, read the same way.

PyTorch 2.6 and LibTorch 2.6 side by side: run it in the Debian 13 root,
  scripts/test-trixie.sh --run "scripts/build.sh && bench/compare_fsdp.py --rounds 3"
or, anywhere, with the build and the python3 it finds:
  bench/compare_fsdp.py --build build --worlds 2 --models wide-mlp --rounds 3
  bench/compare_fsdp.py --device cuda --dry-run     # the commands a lent GPU would run
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import descendants, free_port, proc_kb

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (PyTorch's FSDP, ddp_train's options that make the same case)
PAIRS = [("FSDP2", ["--reshard-after-forward", "false"]), ("FSDP1", [])]


def model_args(args, model):
    if model == "mlp":
        return ["--model", "mlp"]
    return ["--model", "wide-mlp", "--width", str(args.width), "--depth", str(args.depth)]


def ours_cmd(args, model, world, extra, out_dir):
    backend = "nccl" if args.device == "cuda" else args.backend
    return [os.path.join(args.build, "launcher"), "--nproc", str(world),
            os.path.join(args.build, "ddp_train"), *model_args(args, model), "--optimizer", "adam",
            "--lr", "0.0001", "--dataset", "fashion-mnist", "--data", args.data, "--epochs", "1",
            "--batch-size", "16",
            "--train-subset", str(args.samples_per_rank * world), "--test-subset", "16",
            "--threads", "1", "--backend", backend, "--progress", "off", "--device", args.device,
            "--output-dir", out_dir, "--fsdp", *extra]


def python_cmd(args, model, world, fsdp):
    return [args.python, os.path.join(HERE, "fsdp_reference.py"), "--fsdp", fsdp[-1],
            *model_args(args, model), "--train-subset", str(args.samples_per_rank * world),
            "--threads", "1", "--device", args.device, "--data", args.data]


def rank_programs(args):
    """The executables a rank runs: ddp_train, and the python that --python names (whatever its
    name: python3, python3.11, a virtual environment's python)."""
    return {os.path.realpath(os.path.join(args.build, "ddp_train")), os.path.realpath(args.python)}


def rank_pids(roots, programs):
    """The ranks among `roots` and their descendants: the processes running one of `programs`
    (not the launcher, nor a shell between)."""
    pids = []
    for pid in roots + [d for r in roots for d in descendants(r)]:
        try:
            if os.path.realpath(f"/proc/{pid}/exe") in programs:
                pids.append(pid)
        except OSError:
            pass
    return pids


def gpu_mb():
    """pid -> MB of GPU memory, from nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return {int(p): int(m) for p, m in (line.split(",") for line in out.splitlines() if line)}


def watched(procs, args):
    """Waits for `procs` while reading their ranks' memory; returns (outputs, peak host MB of the
    largest rank, peak GPU MB of the largest rank or None)."""
    host, gpu, device, programs = {}, {}, args.device, rank_programs(args)
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):  # the others would wait for it
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for pid in rank_pids([p.pid for p in procs], programs):
            kb = proc_kb(pid, "smaps_rollup", "Pss:")
            if kb is not None:
                host[pid] = max(host.get(pid, 0), kb / 1024)
        if device == "cuda":
            for pid, mb in gpu_mb().items():
                gpu[pid] = max(gpu.get(pid, 0), mb)
        time.sleep(0.05)
    outputs = [p.communicate()[0] for p in procs]
    failed = [(p, out) for p, out in zip(procs, outputs) if p.returncode != 0]
    for p, out in failed:
        print(f"{' '.join(p.args)}: exit {p.returncode}\n{out}", file=sys.stderr)
    if failed:
        return None
    return outputs, max(host.values(), default=0), max(gpu.values(), default=None)


def watched_again(start, args):
    """watched() of the processes start() makes, a second time where a rank failed (PyTorch's gloo
    aborts now and then as a job ends: "terminate called without an active exception"); said."""
    for attempt in (1, 2):
        result = watched(start(), args)
        if result is not None:
            return result
        print(f"a rank failed (attempt {attempt})", file=sys.stderr, flush=True)
    raise SystemExit("a rank failed twice")


def run_ours(args, model, world, extra):
    with tempfile.TemporaryDirectory() as out:
        _, host, gpu = watched_again(
            lambda: [subprocess.Popen(ours_cmd(args, model, world, extra, out),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)],
            args)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return json.loads(f.readlines()[-1])["samples_per_s"], host, gpu


def python_ranks(args, model, world, fsdp):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   USE_LIBUV="0")  # Debian's PyTorch 2.6 has no libuv store
        procs.append(subprocess.Popen(python_cmd(args, model, world, fsdp), env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def run_python(args, model, world, fsdp, seen_workarounds):
    outputs, host, gpu = watched_again(lambda: python_ranks(args, model, world, fsdp), args)
    for line in outputs[0].splitlines():
        if line.startswith("workaround:") and (fsdp, line) not in seen_workarounds:
            seen_workarounds.add((fsdp, line))
            print(f"{fsdp} {line}", flush=True)
    speed = [json.loads(l) for l in outputs[0].splitlines() if l.startswith("{")][-1]
    return speed["samples_per_s"], host, gpu


def case(args, model, world, fsdp, extra, seen):
    """Interleaved rounds of one case; returns its table row."""
    ours, theirs, ratios = [], [], []
    for r in range(args.rounds):
        runs = [lambda: ours.append(run_ours(args, model, world, extra)),
                lambda: theirs.append(run_python(args, model, world, fsdp, seen))]
        for run in (runs if r % 2 == 0 else runs[::-1]):
            run()
        ratios.append(ours[-1][0] / theirs[-1][0])
        print(f"round {r}: {model} {world} ranks {fsdp}: ours {ours[-1][0]:.1f} samples/s "
              f"{ours[-1][1]:.0f} MB, PyTorch {theirs[-1][0]:.1f} samples/s {theirs[-1][1]:.0f} MB",
              file=sys.stderr, flush=True)

    def median(runs, k):
        figures = [run[k] for run in runs if run[k] is not None]
        if not figures:
            return "-"
        value = statistics.median(figures)
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"

    return (f"| {model} | {world} | {fsdp} / ddp_train --fsdp {' '.join(extra)} "
            f"| {median(ours, 0)} | {median(theirs, 0)} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {median(ours, 1)} | {median(theirs, 1)} "
            f"| {median(ours, 2)} | {median(theirs, 2)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default="/usr/bin/python3", help="the python3 with PyTorch")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST")
    p.add_argument("--models", nargs="+", choices=["mlp", "wide-mlp"], default=["mlp", "wide-mlp"])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--fsdp", nargs="+", choices=["FSDP2", "FSDP1"], default=["FSDP2", "FSDP1"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--samples-per-rank", type=int, default=256)
    p.add_argument("--backend", choices=["shm", "gloo", "mpi"], default="shm",
                   help="ours on cpu (cuda: nccl)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dry-run", action="store_true",
                   help="print each case's two commands (rank 0's for PyTorch) and run nothing")
    args = p.parse_args()
    pairs = [(fsdp, extra) for fsdp, extra in PAIRS if fsdp in args.fsdp]
    cases = [(m, w, f, e) for m in args.models for w in args.worlds for f, e in pairs]
    if args.dry_run:
        for model, world, fsdp, extra in cases:
            print(" ".join(ours_cmd(args, model, world, extra, "OUT")))
            print(f"RANK=0..{world - 1} WORLD_SIZE={world} ... "
                  + " ".join(python_cmd(args, model, world, fsdp)))
        return
    if args.device == "cuda" and shutil.which("nvidia-smi") is None:
        raise SystemExit("--device cuda: no nvidia-smi here (no GPU?); --dry-run prints the commands")
    seen = set()
    rows = [case(args, *c, seen) for c in cases]
    print(f"\n{args.device}, {args.rounds} rounds (medians), {args.samples_per_rank} samples a rank, "
          f"batch 16 a rank, one thread a rank; wide MLP {args.depth} x {args.width}\n")
    print("| model | ranks | case | ours samples/s | PyTorch samples/s | ours / PyTorch (range) "
          "| ours peak MB/rank | PyTorch peak MB/rank | ours GPU MB/rank | PyTorch GPU MB/rank |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
