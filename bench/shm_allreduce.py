#!/usr/bin/python3
"""All-reduce of 2 MiB and 32 MiB (float32 sum) between the ranks of one host: our shared memory
(shm) on buffers the group allocated (as DDP's buckets are: reduced in place) and on any other
tensor (staged through the channel's slots), against gloo (loopback TCP) and Open MPI (mpirun,
its vader shared memory); beside them, this machine's memcpy of the same bytes run by every rank
at once (memcpy-all: the ranks share the memory bus, so that is the floor's unit) and by one
process alone (ddp_bench_allreduce's memcpy columns).

Each round runs the jobs (the order rotates); per size, the medians of the rounds, and each time
as a multiple of memcpy-all's, taken within its round. --op all-gather or reduce-scatter times
that collective of the same bytes instead (the gathered tensor's, the scattered input's), the
buffers then holding the gathered tensor or the scattered input, as FSDP's units do.

--average averages instead (ReduceOp::kAvg, DDP's buckets' op); --jobs picks among the jobs;
--against BINARY adds shm-buffers run by another build's ddp_bench_allreduce ("against"), in
the same rounds, for a change's effect (it must know the options given).

  bench/shm_allreduce.py --rounds 5 [--world 2] [--op all-gather]
  bench/shm_allreduce.py --rounds 7 --jobs shm-buffers --against OLD/build/ddp_bench_allreduce
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
JOBS = {"shm-buffers": ("shm", ["--buffers"]), "shm-staged": ("shm", []), "gloo": ("gloo", []),
        "mpi": ("mpi", [])}


def table(text):
    """{bytes: (time us, memcpy us, memcpy-all us)} from ddp_bench_allreduce's output."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 7 and fields[0].isdigit():
            rows[int(fields[0])] = (float(fields[2]), float(fields[5]), float(fields[6]))
    return rows


def run(job, args):
    backend, extra = JOBS[job] if job != "against" else JOBS["shm-buffers"]
    binary = args.against if job == "against" else args.binary
    cmd = [binary, "--backend", backend, "--iters", str(args.iters), "--op", args.op, *SIZES,
           *extra, *(["--average"] if args.average else [])]
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
    p.add_argument("--op", default="all-reduce", choices=["all-reduce", "all-gather", "reduce-scatter"])
    p.add_argument("--average", action="store_true")
    p.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    p.add_argument("--against", help="another build's ddp_bench_allreduce: its shm-buffers too")
    args = p.parse_args()
    jobs = args.jobs + (["against"] if args.against else [])
    times = collections.defaultdict(list)    # (job, bytes) -> us
    ratios = collections.defaultdict(list)   # (job, bytes) -> time / memcpy-all of its run
    copies = collections.defaultdict(list)   # bytes -> (memcpy us, memcpy-all us)
    for r in range(args.rounds):
        for job in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
            for size, (t, copy, together) in run(job, args).items():
                times[(job, size)].append(t)
                ratios[(job, size)].append(t / together)
                copies[size].append((copy, together))
        print(f"round {r} done", file=sys.stderr)
    print(f"{args.world} ranks, float32 {'average' if args.average else 'sum'}, {args.rounds} rounds "
          f"of {args.iters} calls of {args.op}\n")
    print("| bytes | memcpy alone (us) | memcpy-all (us) | "
          + " | ".join(f"{j} (us) | {j}/memcpy-all" for j in jobs) + " |")
    print("|---|---|---|" + "---|---|" * len(jobs))
    for size in sorted(copies):
        alone = statistics.median(c[0] for c in copies[size])
        together = statistics.median(c[1] for c in copies[size])
        cells = []
        for j in jobs:
            cells += [f"{statistics.median(times[(j, size)]):.0f}",
                      f"{statistics.median(ratios[(j, size)]):.2f}"]
        print(f"| {size} | {alone:.0f} | {together:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
