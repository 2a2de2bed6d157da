#!/usr/bin/python3
"""ddp_train against PyTorch's Python DDP at world size 1 on one device (a GPU, or the CPU): the
ResNet-18 recipe (configs/fashion_mnist_resnet18.yaml, global batch 256) and the MLP at batch 64,
each in fp32 and under bf16 autocast, interleaved rounds, ratios within a round.

Ours runs as ddp_train started with the env contract (nccl on cuda, its CPU default on cpu);
PyTorch's as bench/ddp_reference.py with the env contract (nccl on cuda, gloo on cpu). Both keep
the dataset in host memory and move each batch to the device per step. Each side runs once per
workload and precision before the rounds (a warm-up, not counted). Samples/s is each side's
epoch figure: the epoch's training samples over its training time.

--out DIR gets runs.jsonl (one line per counted run: side, workload, precision, round,
samples_per_s) and summary.md (a Markdown table of the ratios); the table is also printed.
"""
import argparse
import json
import os
import sys
import tempfile

from benchlib import env_job, interleaved_rounds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name: (ddp_train's config, per-rank batch at world 1, ddp_reference.py's model and the config's
# optimizer)
WORKLOADS = {
    "resnet18": ("fashion_mnist_resnet18.yaml", 256,
                 ["--model", "resnet18", "--lr", "0.1", "--momentum", "0"]),
    "mlp": ("fashion_mnist_mlp.yaml", 64, ["--model", "mlp", "--lr", "0.02", "--momentum", "0.9"]),
}
PRECISIONS = {"fp32": "off", "bf16": "bf16"}


def ours(args, workload, precision, tmp):
    """ddp_train's samples/s, written to a fresh output directory under tmp (a run never sees an
    earlier one's metrics or checkpoints)."""
    config, batch, _ = WORKLOADS[workload]
    out_dir = tempfile.mkdtemp(dir=tmp)
    cmd = [args.binary, "--config", os.path.join(ROOT, "configs", config), "--data", args.data,
           "--epochs", str(args.epochs), "--train-subset", str(args.train_subset),
           "--batch-size", str(batch), "--device", args.device, "--amp", PRECISIONS[precision],
           "--threads", str(args.threads), "--output-dir", out_dir, "--log-level", "warn",
           "--eval-every", "0"]
    if args.device == "cuda":
        cmd += ["--backend", "nccl"]
    env_job(cmd, 1)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return json.loads(f.readlines()[-1])["samples_per_s"]


def python(args, workload, precision):
    _, batch, model = WORKLOADS[workload]
    out = env_job([args.python, os.path.join(HERE, "ddp_reference.py"), "--data", args.data,
                   "--epochs", str(args.epochs), "--train-subset", str(args.train_subset),
                   "--batch-size", str(batch), "--device", args.device,
                   "--amp", PRECISIONS[precision], "--threads", str(args.threads)] + model, 1)
    return json.loads(out.splitlines()[-1])["samples_per_s"]


def measure(args, workload, precision, runs, tmp):
    """Warm-up, then interleaved rounds; writes each counted run to `runs` (a file) as it ends, so
    that a job stopped by a time limit keeps the runs done."""
    for _ in range(args.warmup):
        ours(args, workload, precision, tmp)
        python(args, workload, precision)

    def recorded(side, run):
        done = []

        def call():
            done.append(run())
            runs.write(json.dumps({"side": side, "workload": workload, "precision": precision,
                                   "round": len(done) - 1, "samples_per_s": done[-1]}) + "\n")
            runs.flush()
            return done[-1]
        return call

    return interleaved_rounds(recorded("ddp_train", lambda: ours(args, workload, precision, tmp)),
                              recorded("pytorch", lambda: python(args, workload, precision)),
                              args.rounds, f"{workload} {precision}")


def summary(device, rows):
    lines = ["| workload | precision | ddp_train samples/s | PyTorch DDP samples/s | ratio (median) | min-max |",
             "|---|---|---|---|---|---|"]
    for workload, precision, x, y, m, lo, hi in rows:
        lines.append(f"| {workload} | {precision} | {x:.1f} | {y:.1f} | {m:.2f}x | {lo:.2f}-{hi:.2f} |")
    head = f"World size 1 on {device}; ratio: ddp_train over PyTorch DDP within a round.\n\n"
    return head + "\n".join(lines) + "\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "ddp_train"))
    p.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="uncounted runs per side before the rounds")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-subset", type=int, default=0, help="the first N samples only (0: all)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    p.add_argument("--out", required=True, help="directory for runs.jsonl and summary.md")
    return p.parse_args()


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(args.out, "runs.jsonl"), "w") as runs:
        for workload in args.workloads:
            for precision in args.precisions:
                rows.append((workload, precision) + measure(args, workload, precision, runs, tmp))
    text = summary(args.device, rows)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
