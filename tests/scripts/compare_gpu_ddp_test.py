#!/usr/bin/env python3
"""bench/compare_gpu_ddp.py's smoke on the CPU: both workloads, both precisions, both sides, one
round on 4 samples of Fashion-MNIST (the test split cut to 4 too, as ddp_train evaluates after its
last epoch), without the warm-up: on a CPU without AVX-512 BF16 both LibTorch and PyTorch run
ResNet-18's bf16 convolutions at about 1 s an image, so this is what keeps the smoke near 20 s.
summary.md must have every row, each figure positive, and runs.jsonl one line per side and row.

Usage: compare_gpu_ddp_test.py SOURCE_DIR BUILD_DIR PYTHON
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

DATA = "/usr/share/datasets/fashion-mnist"
ROWS = {(w, p) for w in ("resnet18", "mlp") for p in ("fp32", "bf16")}


def cut_dataset(out_dir, sizes):
    """Writes the first sizes[split] samples of each split of DATA (idx files, gzipped)."""
    for split, n in sizes.items():
        for kind, ndim in (("images", 3), ("labels", 1)):
            name = f"{split}-{kind}-idx{ndim}-ubyte.gz"
            with gzip.open(os.path.join(DATA, name)) as f:
                data = f.read()
            item = 784 if kind == "images" else 1
            header = data[:4] + n.to_bytes(4, "big") + data[8:4 + 4 * ndim]
            with gzip.open(os.path.join(out_dir, name), "wb") as f:
                f.write(header + data[4 + 4 * ndim:4 + 4 * ndim + n * item])


def figures(summary):
    """(workload, precision) -> the row's numbers, from summary.md's table."""
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and (cells[0], cells[1]) in ROWS:
            rows[(cells[0], cells[1])] = [float(cells[2]), float(cells[3]), float(cells[4].rstrip("x"))] + \
                [float(x) for x in cells[5].split("-")]
    return rows


def main():
    source, build, python = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        data, out = os.path.join(tmp, "data"), os.path.join(tmp, "out")
        os.makedirs(data)
        cut_dataset(data, {"train": 4, "t10k": 4})
        subprocess.run([python, os.path.join(source, "bench", "compare_gpu_ddp.py"), "--device", "cpu",
                        "--rounds", "1", "--warmup", "0", "--train-subset", "4", "--epochs", "1",
                        "--data", data,
                        "--binary", os.path.join(build, "ddp_train"), "--python", python,
                        "--out", out], check=True)
        with open(os.path.join(out, "summary.md")) as f:
            rows = figures(f.read())
        with open(os.path.join(out, "runs.jsonl")) as f:
            runs = [json.loads(line) for line in f]
    failures = [f"summary.md has no row {r}" for r in ROWS - rows.keys()]
    failures += [f"row {r} has a figure not positive: {v}" for r, v in rows.items() if min(v) <= 0]
    counted = {(r["side"], r["workload"], r["precision"]) for r in runs if r["samples_per_s"] > 0}
    failures += [f"runs.jsonl has no positive run of {s} {w} {p}" for s in ("ddp_train", "pytorch")
                 for w, p in ROWS if (s, w, p) not in counted]
    print("\n".join(failures) or "every row, every figure positive")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
