#!/usr/bin/python3
"""The single-process MLP on Fashion-MNIST in Python PyTorch: the reference for ddp_train.

Same model (nn.Sequential 784-512-256-10), same normalisation, SGD with momentum, a DataLoader
with batch 64 and shuffle, as PyTorch's examples do. Prints one JSON line with the epoch's
training samples/s (evaluation excluded), like ddp_train's metrics file.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, prefix, subset=0):
    """The split `prefix` (train, t10k), its first `subset` samples where not 0 (ddp_train's
    --train-subset)."""
    images = torch.from_numpy(read_idx(f"{data_dir}/{prefix}-images-idx3-ubyte.gz").copy())
    labels = torch.from_numpy(read_idx(f"{data_dir}/{prefix}-labels-idx1-ubyte.gz").copy())
    if subset:
        images, labels = images[:subset], labels[:subset]
    images = ((images.float() / 255.0 - MEAN) / STD).unsqueeze(1)
    return TensorDataset(images, labels.long())


def make_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def parser():
    """The options of the MLP references (this one and ddp_reference.py), ddp_train's defaults."""
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-subset", type=int, default=0, help="the first N samples only (0: all)")
    return p


def parse_args():
    return parser().parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_set, test_set = load(args.data, "train", args.train_subset), load(args.data, "t10k")
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item()
                          for x, y in DataLoader(test_set, batch_size=1000))
        print(json.dumps({"epoch": epoch + 1, "samples_per_s": len(train_set) / seconds,
                          "epoch_seconds": seconds, "test_accuracy": correct / len(test_set)}))


if __name__ == "__main__":
    main()
