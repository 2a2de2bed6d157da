#!/usr/bin/python3
"""All-reduce of 2 MiB and 32 MiB (float32 sum) between the ranks of one host: our shared memory
(shm) against gloo (loopback TCP) and Open MPI (mpirun, its vader shared memory), and this
machine's memcpy of the same bytes (ddp_bench_allreduce's memcpy column, on rank 0).

Each round runs the three jobs (the order rotates); per size, the medians of the rounds, and
each time as a multiple of the memcpy's: an all-reduce of 2 ranks reads and writes each byte a
few times (into the segment, combined, out), so a few memcpys is the floor.

  bench/shm_allreduce.py --rounds 5 [--world 2]
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys

from benchlib import env_job

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = ["--min-bytes", str(2 << 20), "--max-bytes", str(32 << 20), "--factor", "16"]


def table(text):
    """{bytes: (time us, memcpy us)} from ddp_bench_allreduce's output."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[2]), float(fields[5]))
    return rows


def run(backend, args):
    cmd = [args.binary, "--backend", backend, "--iters", str(args.iters), *SIZES]
    if backend == "mpi":
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
                  "-np", str(args.world)]
        return table(subprocess.run(mpirun + cmd, check=True, capture_output=True, text=True,
                                    timeout=600).stdout)
    return table(env_job(cmd, args.world, timeout=600))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(HERE, "..", "build", "ddp_bench_allreduce"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    backends = ["shm", "gloo", "mpi"]
    times = collections.defaultdict(list)    # (backend, bytes) -> us
    copies = collections.defaultdict(list)   # bytes -> memcpy us
    for r in range(args.rounds):
        for backend in backends[r % 3:] + backends[:r % 3]:
            for size, (t, copy) in run(backend, args).items():
                times[(backend, size)].append(t)
                copies[size].append(copy)
        print(f"round {r} done", file=sys.stderr)
    print(f"{args.world} ranks, float32 sum, {args.rounds} rounds of {args.iters} all-reduces\n")
    print("| bytes | memcpy (us) | " + " | ".join(f"{b} (us) | {b}/memcpy" for b in backends) + " |")
    print("|---|---|" + "---|---|" * len(backends))
    for size in sorted(copies):
        copy = statistics.median(copies[size])
        cells = []
        for b in backends:
            t = statistics.median(times[(b, size)])
            cells += [f"{t:.0f}", f"{t / copy:.1f}"]
        print(f"| {size} | {copy:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
