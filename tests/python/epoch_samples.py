#!/usr/bin/python3
"""Checks a mid-epoch checkpoint's "epoch_samples" against PyTorch's DistributedSampler.

    epoch_samples.py CHECKPOINT SIZE WORLD SEED EPOCH TRAINED

The epoch's sequence is every rank's DistributedSampler indices interleaved (rank r's are every
WORLD-th from r); after TRAINED of them the rest is what the checkpoint must hold, in order.
Prints "ok N" (N ids) or the first difference, and exits non-zero on a difference.
"""
import sys

import torch
from torch.utils.data import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


path, size, world, seed, epoch, trained = sys.argv[1], *map(int, sys.argv[2:])
shares = []
for rank in range(world):
    sampler = DistributedSampler(Sized(size), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    shares.append(list(sampler))
sequence = [share[i] for i in range(len(shares[0])) for share in shares]
expected = sequence[trained:]
got = torch.load(path, weights_only=True)["epoch_samples"].tolist()
if got != expected:
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    sys.exit(f"{path}: epoch_samples has {len(got)} ids, PyTorch's sampler leaves {len(expected)}; "
             f"first difference at {first}: {got[first:first + 5]} vs {expected[first:first + 5]}")
print("ok", len(got))
