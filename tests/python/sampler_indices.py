#!/usr/bin/python3
"""Prints torch.utils.data.DistributedSampler's indices for every case the C++ test checks.

One line per case: "size world rank shuffle seed epoch drop_last: i0 i1 ...".
"""
import itertools

from torch.utils.data import DistributedSampler


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


for size, world, shuffle, seed, epoch, drop_last in itertools.product(
        [1, 7, 100, 1001], range(1, 6), [False, True], [0, 42], range(3), [False, True]):
    for rank in range(world):
        s = DistributedSampler(Sized(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        print(f"{size} {world} {rank} {int(shuffle)} {seed} {epoch} {int(drop_last)}:",
              " ".join(map(str, s)))
