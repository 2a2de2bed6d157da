#!/usr/bin/python3
"""ddp_train against PyTorch's Python DDP (gloo): the MLP on Fashion-MNIST, one epoch, batch 64
per rank, one thread per rank, worlds 1 and 2, interleaved rounds, ratios within a round. With
--model resnet18: ResNet-18 on its CPU config (SGD, lr 0.1, no momentum), with --train-subset
and --batch-size (per rank); with --epochs 2 the figures are the last epoch's on both sides (the
first a warm-up).

Ours runs as ddp_train (world 1: the local backend, as a plain run; world 2: ranks started with
the env contract on gloo and on shm, our shared memory, the env contract's default on one host,
and under mpirun on Open MPI's mpi and with mpirun's default on one host, shm); Python's as
bench/ddp_reference.py with the env contract. Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import json
import os
import subprocess
import tempfile

from benchlib import env_job, interleaved_rounds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


CONFIGS = {"mlp": "fashion_mnist_mlp.yaml", "resnet18": "fashion_mnist_resnet18_cpu.yaml"}


def workload(args):
    """The options both sides take for --model, --train-subset, --batch-size and --epochs."""
    out = ["--epochs", str(args.epochs)]
    if args.train_subset:
        out += ["--train-subset", str(args.train_subset)]
    if args.batch_size:
        out += ["--batch-size", str(args.batch_size)]
    return out


def ours(args, world, launcher, out_dir):
    binary = args.binary
    cmd = [binary, "--config", os.path.join(ROOT, "configs", CONFIGS[args.model]), *workload(args),
           "--threads", "1", "--output-dir", out_dir, "--log-level", "warn", "--eval-every", "0"]
    if world == 1:
        subprocess.run(cmd, check=True)
    elif launcher in ("env", "shm"):
        env_job(cmd + ["--backend", "gloo" if launcher == "env" else "shm"], world)
    else:
        # mpirun: Open MPI's own collectives; mpirun-shm: no --backend, so mpirun's default on
        # one host (our shared memory, its rendezvous over MPI).
        backend = ["--backend", "mpi"] if launcher == "mpirun" else []
        subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
                        "-np", str(world)] + cmd + backend, check=True)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return json.loads(f.readlines()[-1])["samples_per_s"]


def python(args, world):
    # The config's own settings where ddp_train takes them from it (fashion_mnist_resnet18_cpu.yaml:
    # 2,048 samples, SGD at 0.1 without momentum).
    model = [] if args.model == "mlp" else ["--model", "resnet18", "--lr", "0.1", "--momentum", "0",
                                            "--train-subset", str(args.train_subset or 2048)]
    out = env_job(["/usr/bin/python3", os.path.join(HERE, "ddp_reference.py"), "--threads", "1",
                   *model, *workload(args)], world)
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ddp_train"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", choices=sorted(CONFIGS), default="mlp")
    p.add_argument("--epochs", type=int, default=1, help="the figures are the last epoch's")
    p.add_argument("--train-subset", type=int, default=0, help="0: the config's")
    p.add_argument("--batch-size", type=int, default=0, help="per rank; 0: the config's")
    p.add_argument("--only", nargs="*", default=None,
                   help="of plain, env (gloo), shm, mpirun (mpi), mpirun-shm: these alone")
    args = p.parse_args()
    configs = [(1, "plain"), (2, "env"), (2, "shm"), (2, "mpirun"), (2, "mpirun-shm")]
    configs = [c for c in configs if args.only is None or c[1] in args.only]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world, launcher in configs:
            rows.append((world, launcher) + interleaved_rounds(
                lambda: ours(args, world, launcher, tmp), lambda: python(args, world), args.rounds,
                f"world {world} {launcher}"))
    print("| world | ddp_train (backend) | ddp_train samples/s | PyTorch DDP gloo samples/s | ratio (median) | min-max |")
    print("|---|---|---|---|---|---|")
    names = {"plain": "local", "env": "gloo", "shm": "shm", "mpirun": "mpi (under mpirun)",
             "mpirun-shm": "shm (under mpirun)"}
    for world, launcher, x, y, m, lo, hi in rows:
        print(f"| {world} | {names[launcher]} | {x:.0f} | {y:.0f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")


if __name__ == "__main__":
    main()
