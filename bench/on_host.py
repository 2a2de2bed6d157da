#!/usr/bin/python3
"""How close 2 ranks on one host come to training with no communication at all.

One epoch of the MLP on Fashion-MNIST, batch 64 per rank, one thread per rank, evaluation
excluded. The ceiling: two single-process runs of ddp_train started at once on the same cores
(their samples/s summed): the same work, nothing shared. Against it: world 2 under mpirun with
--backend mpi (Open MPI's shared memory), under our launcher with its default backend (shm: our
shared memory) and under our launcher with --backend gloo (gloo over loopback TCP); with
--settings also under mpirun with --backend shm (mpirun-shm, its default on one host).
Interleaved rounds (the order rotates); each ratio is taken within its round. A last run of
each with --timeline (or, with --timeline-rounds, every run of the rounds, the table then
their medians) gives the breakdown of a step (rank 0's means): forward, backward's
computation, the wait for the all-reduces at backward's end, the optimizer, the rest (loading
the batch, zeroing gradients); and each bucket's all-reduce from launch to completion. The wait is
split where the last rank launched the step's last bucket: before that, rank 0 waited for a rank
whose step ran slower (the ranks' own speeds differ from step to step, which two independent
processes do not pay for); after it, the collective itself.

--variant NAME=DIR and settings such as launcher@NAME run another build's binaries in the same
rounds (a change measured against main built beside it).

--config runs another workload the same way (ResNet-18: configs/fashion_mnist_resnet18_cpu.yaml,
with --extra --train-subset 512 --batch-size 32 for a shorter epoch).

  bench/on_host.py --rounds 3 [--extra --gradient-as-bucket-view]
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def command(args, out, timeline=None, build=None):
    cmd = [os.path.join(build or args.build, "ddp_train"), "--config", args.config, "--epochs", "1",
           "--threads", "1", "--eval-every", "0", "--log-level", "warn", "--output-dir", out,
           *args.extra]
    return cmd + (["--timeline", timeline] if timeline else [])


def samples_per_s(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return json.loads(f.readline())


def run(args, setting, timeline=None):
    """Global samples/s of one epoch (and the metrics of rank 0's run). A setting with "+view"
    (launcher+view, mpirun-shm+view) runs with --gradient-as-bucket-view; one with "@NAME"
    (launcher@new) runs the binaries of the build that --variant NAME=DIR names."""
    setting, _, name = setting.partition("@")
    build = args.variants[name] if name else args.build
    setting, _, variant = setting.partition("+")
    view = ["--gradient-as-bucket-view"] if variant == "view" else []
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        if setting == "ceiling":
            procs = [subprocess.Popen(command(args, a, timeline)), subprocess.Popen(command(args, b))]
            if any(p.wait() for p in procs):
                raise SystemExit("a single-process run failed")
            return sum(samples_per_s(d)["samples_per_s"] for d in (a, b)), samples_per_s(a)
        if setting.startswith("mpirun"):
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl",
                   "self,vader", "-np", "2", *command(args, a, timeline, build)]
            cmd += ["--backend", "shm" if setting == "mpirun-shm" else "mpi"]
        else:
            cmd = [os.path.join(build, "launcher"), "--nproc", "2",
                   *command(args, a, timeline, build)]
            if setting == "launcher-gloo":
                cmd += ["--backend", "gloo"]
        subprocess.run(cmd + view, check=True, stdout=subprocess.DEVNULL)
        metrics = samples_per_s(a)
        return metrics["samples_per_s"], metrics


def breakdown(trace_path, metrics):
    """Rank 0's milliseconds per step by span name, and the step's period."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total = collections.Counter()
    buckets = collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != 0:
            continue
        if e["name"] == "all-reduce":
            buckets[e["tid"]] += e["dur"] / 1e3
        else:
            total[e["name"]] += e["dur"] / 1e3
    steps = metrics["steps"]
    period = 1e3 * metrics["epoch_seconds"] / steps
    wait = total["finalize: wait for all-reduces"] / steps
    parts = {"forward": total["forward"] / steps,
             "backward (computation)": total["backward"] / steps - wait,
             "backward (waiting for all-reduces)": wait,
             "optimizer": total["optimizer step"] / steps}
    parts["rest (batch, zero_grad, ...)"] = period - sum(parts.values())
    parts.update(split_wait(events))  # two rows within the wait's
    reduces = [buckets[lane] / steps for lane in sorted(buckets)]
    return period, parts, reduces


def split_wait(events):
    """Rank 0's wait at backward's end, split at the moment the last rank launched each step's
    last bucket: before it, the other ranks were still computing (their step ran slower than rank
    0's); after it, the collective itself, handed over and completed."""
    last = collections.defaultdict(dict)  # step -> rank -> that step's last all-reduce
    for e in events:
        if e.get("ph") == "X" and e["name"] == "all-reduce":
            step, rank = e.get("args", {}).get("step"), e["pid"]
            if step is not None and e["ts"] > last[step].get(rank, {"ts": -1})["ts"]:
                last[step][rank] = e
    late, after = [], []
    for by_rank in last.values():
        if 0 not in by_rank or len(by_rank) < 2:
            continue
        everyone = max(e["ts"] for e in by_rank.values())
        mine = by_rank[0]
        late.append(max(0.0, everyone - mine["ts"]) / 1e3)
        after.append(max(0.0, mine["ts"] + mine["dur"] - everyone) / 1e3)
    if not late:
        return {}
    return {"  of it: the other rank still computing": statistics.mean(late),
            "  of it: the last bucket once every rank launched it": statistics.mean(after)}


def timed_run(args, setting):
    """One run with rank 0's timeline: its global samples/s and its step's breakdown (ms by
    row, as the table prints them; each bucket's all-reduce, in bucket order, as a tuple)."""
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        value, metrics = run(args, setting, trace)
        period, parts, reduces = breakdown(trace, metrics)
    cells = {"step": period, **parts}
    cells["each bucket's all-reduce"] = tuple(reduces)
    return value, cells


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml"))
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="ddp_train options for every run (after the others)")
    p.add_argument("--settings", nargs="*",
                   default=["ceiling", "mpirun", "launcher", "launcher-gloo"],
                   help="ceiling (first), mpirun, mpirun-shm, launcher, launcher-gloo; any but "
                        "the ceiling with +view: with --gradient-as-bucket-view, with @NAME: "
                        "another build's binaries (--variant)")
    p.add_argument("--timeline-rounds", action="store_true",
                   help="every run in the rounds records rank 0's timeline; the breakdown is "
                        "then the rounds' medians (of the runs the ratios come from), each "
                        "round's printed beside its figures")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                   help="a build directory (or any with its ddp_train and launcher) that "
                        "settings ending in @NAME run")
    args = p.parse_args()
    args.variants = dict(v.split("=", 1) for v in args.variant)
    settings = args.settings
    got = collections.defaultdict(list)
    ratios = collections.defaultdict(list)
    steps = collections.defaultdict(list)  # setting -> each timeline run's breakdown
    for r in range(args.rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        this = {}
        for s in order:
            if args.timeline_rounds:
                this[s], cells = timed_run(args, s)
                steps[s].append(cells)
            else:
                this[s] = run(args, s)[0]
        for s in settings:
            got[s].append(this[s])
        for s in settings[1:]:
            ratios[s].append(this[s] / this["ceiling"])
        print(f"round {r}: " + ", ".join(f"{s} {this[s]:.0f}" for s in settings), file=sys.stderr)
        for s in settings if args.timeline_rounds else []:
            print(f"  {s}: " + ", ".join(f"{k.strip()} {v:.2f}" for k, v in steps[s][-1].items()
                                         if isinstance(v, float)), file=sys.stderr)
    print(f"options: {' '.join(args.extra) or '(defaults)'}\n")
    print("| run | samples/s (median) | of the ceiling (median) | min-max |")
    print("|---|---|---|---|")
    print(f"| ceiling: 2 single processes | {statistics.median(got['ceiling']):.0f} | 1 | |")
    for s in settings[1:]:
        print(f"| {s} | {statistics.median(got[s]):.0f} | {statistics.median(ratios[s]):.2f} | "
              f"{min(ratios[s]):.2f}-{max(ratios[s]):.2f} |")
    where = f"the medians of the {args.rounds} rounds" if args.timeline_rounds else "one run each"
    print(f"\n| ms per step (rank 0, {where}) | " + " | ".join(settings) + " |")
    print("|---|" + "---|" * len(settings))
    rows = collections.defaultdict(dict)
    for s in settings:
        runs = steps[s] or [timed_run(args, s)[1]]
        for name in runs[0]:
            values = [cells[name] for cells in runs if name in cells]
            if isinstance(values[0], tuple):  # the buckets' medians, bucket by bucket
                rows[name][s] = ", ".join(f"{statistics.median(ms):.2f}"
                                          for ms in zip(*values)) or "-"
            else:
                rows[name][s] = f"{statistics.median(values):.2f}"
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells.get(s, "-") for s in settings) + " |")


if __name__ == "__main__":
    main()
