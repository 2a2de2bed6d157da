#!/usr/bin/python3
"""A storm of faults on an elastic job, against the same job without faults.

The job: `launcher --nnodes 1:1 --nproc W --max-restarts many [--warm-spare] ddp_train --elastic`
on the MLP (Fashion-MNIST, one thread a rank, no evaluation, --record-samples). The storm: every
--period seconds a random live worker is SIGKILLed; the launcher restarts it, and it joins the
running group. Fault-free and storm runs alternate in interleaved rounds.

No kill once rank 0 said the training is done. Reported per round: each job's wall time, the
goodput (fault-free time / storm time), each job's CPU seconds (all its processes) and their
ratio, the faults, whether every epoch trained every sample exactly once (from samples.jsonl),
and the workers' CPU seconds (the launcher's line at each worker's end), of them the lost workers'
and those of the replacements lost before they joined a generation.
Then each fault's time, split at the marks the launcher and the ranks print, each line stamped
here as it arrives (one clock for all; the launcher's own lines carry no time):
  detect   the kill -> the survivors' step fails ("step N failed")
  shrink   -> the smaller group commits a step ("committed by generation G of W-1 rank(s)")
  start    the kill -> the launcher takes the replacement in ("generation G of W worker(s)": the
           loss window, its restart, process start, LibTorch load, data and model)
  grow     -> the bigger group commits a step ("committed by generation G of W rank(s)")
And what a fault cost within the storm run, which the host's drift between runs does not enter:
the steps committed in the 5 s after each kill (half the period, if shorter) against those of the
5 s before it, as seconds of training lost (the steps read from samples.jsonl every 0.2 s).

  bench/fault_storm.py --workers 3 --epochs 30 --period 10 --rounds 2 [--warm-spare]
"""
import argparse
import collections
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def command(args, out):
    spare = ["--warm-spare"] if args.warm_spare else []
    return [os.path.join(args.build, "launcher"), "--nnodes", "1:1", "--nproc", str(args.workers),
            "--max-restarts", "100000", *spare, os.path.join(args.build, "ddp_train"), "--config",
            os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml"), "--elastic", "--epochs",
            str(args.epochs), "--eval-every", "0", "--threads", "1", "--progress", "off",
            "--record-samples", "--output-dir", out, *args.extra]


class StepClock:
    """The committed steps over time, from the sample record (one line a committed step, appended
    by rank 0): every 0.2 s, the step of the last line written since the last look. Reads only
    the new bytes; a record restarted (shorter than read) is read from its start."""

    def __init__(self, path, start):
        self.path, self.start, self.seen = path, start, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch)
        self.thread.start()

    def watch(self):
        at, step, tail = 0, 0, b""
        while not self.done.wait(0.2):
            try:
                with open(self.path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < at:
                        at, tail = 0, b""
                    f.seek(at)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            at += len(chunk)
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in reversed(lines):
                if m := re.search(rb'"step":(\d+)', line):
                    step = int(m.group(1))
                    break
            self.seen.append((time.monotonic() - self.start, step))

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.seen


def run_job(args, out, period):
    """Runs the job, killing a random live worker every `period` s (0: none). Returns (wall s,
    CPU s, exit code, [(arrival s, line)], [kill times], [(s, committed steps)])."""
    start = time.monotonic()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(command(args, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    lines, live, live_lock = [], {}, threading.Lock()  # live: the reader's, read by the kills
    started = re.compile(
        r"^\[launcher\] elastic: worker (\S+) \(local rank \d+\) started: pid (\d+)")
    lost = re.compile(r"^\[launcher\] elastic: worker (\S+) \(local rank \d+, pid \d+\) lost")

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
            with live_lock:
                if m := started.match(line):
                    live[m.group(1)] = int(m.group(2))
                elif m := lost.match(line):
                    live.pop(m.group(1), None)

    reader = threading.Thread(target=read)
    reader.start()
    clock = StepClock(os.path.join(out, "samples.jsonl"), start)
    kills = []
    while True:
        try:  # the job's end is seen at once: a sleep would stretch the storm's time to a period
            proc.wait(timeout=period if period else None)
            break
        except subprocess.TimeoutExpired:
            pass
        with live_lock:
            pids = list(live.values())
        # Not once rank 0 said the training is done: a worker lost after its training loop fails
        # the job by design (no generation can take it in), and the storm is about training.
        if pids and not any("] done: " in line for _, line in lines):
            pid = random.choice(pids)
            kills.append(time.monotonic() - start)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                kills.pop()
    wall = time.monotonic() - start
    reader.join()
    steps = clock.stop()
    # The CPU the job's processes used (the launcher's, and its workers', which it reaped): less
    # moved than the wall time by a shared host's drift.
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return wall, cpu, proc.returncode, lines, kills, steps


def exactly_once(out):
    """(epochs whose every sample was trained exactly once, epochs) from samples.jsonl."""
    seen = collections.defaultdict(collections.Counter)
    with open(os.path.join(out, "samples.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            for ids in record["ids"]:
                seen[record["epoch"]].update(ids)
    good = sum(1 for counts in seen.values()
               if set(counts.values()) == {1} and sorted(counts) == list(range(len(counts))))
    return good, len(seen)


def first_after(lines, t, pattern, until=float("inf")):
    """The arrival of the first line at or after `t`, and before `until`, that matches."""
    for at, line in lines:
        if t <= at < until and re.search(pattern, line):
            return at, line
    return None, None


def phases(lines, kills, workers):
    """Each fault's detect, shrink, start and grow, in seconds (None where a mark is missing
    before the next fault: a kill of a replacement still loading changes no group)."""
    out = []
    for i, k in enumerate(kills):
        until = kills[i + 1] if i + 1 < len(kills) else float("inf")
        failed, _ = first_after(lines, k, r"elastic: step \d+ failed", until)
        shrunk = failed and first_after(
            lines, failed, rf"committed by generation \d+ of {workers - 1} rank", until)[0]
        # The launcher takes the replacement in once it is ready (its process started, LibTorch
        # loaded, its data loaded and its model built): "generation G of W worker(s)".
        start = first_after(lines, k, rf"^\[launcher\] elastic: generation \d+ of {workers} worker",
                            until)[0]
        grown = start and first_after(
            lines, start, rf"committed by generation \d+ of {workers} rank", until)[0]
        out.append({"detect": failed and failed - k,
                    "shrink": shrunk and shrunk - failed,
                    "start": start and start - k,
                    "grow": grown and grown - start})
    return out


def steps_at(steps, t):
    """The committed steps at `t`, from the clock's looks (the last look at or before it)."""
    done = 0
    for at, step in steps:
        if at > t:
            break
        done = step
    return done


def fault_costs(steps, kills, window):
    """What each fault cost the job, measured within the storm run, so that the host's drift
    between runs does not enter: the steps committed in the `window` s after the kill against
    those of the `window` s before it, as seconds of training lost. Faults whose windows reach
    past the training's end or back before its start are left out."""
    if not steps:
        return []
    trained_until = min(at for at, step in steps if step == steps[-1][1])  # the last step's
    costs = []
    for k in kills:
        if k - window < 0 or k + window > trained_until:
            continue
        before = steps_at(steps, k) - steps_at(steps, k - window)
        after = steps_at(steps, k + window) - steps_at(steps, k)
        if before > 0:
            costs.append(window * (1 - after / before))
    return costs


WORKER_END = re.compile(r"^\[launcher\] elastic: worker (\S+) \(local rank \d+, pid \d+\) "
                        r"(finished|lost: .*,) after ([0-9.]+) s, ([0-9.]+) CPU s")


def worker_cpu(lines):
    """What each worker cost, from the launcher's line at its end: (CPU s of all workers, CPU s of
    the lost ones, CPU s of the lost ones that never joined a generation: replacements killed while
    they loaded)."""
    joined = set()
    for _, line in lines:
        m = re.search(r"elastic: generation \d+ of \d+ worker\(s\): (\S+)", line)
        if m:
            joined.update(m.group(1).split(","))
    total = lost = wasted = 0.0
    for _, line in lines:
        m = WORKER_END.search(line)
        if not m:
            continue
        cpu = float(m.group(4))
        total += cpu
        if m.group(2) != "finished":
            lost += cpu
            wasted += cpu if m.group(1) not in joined else 0.0
    return total, lost, wasted


def keep(folder, name, lines, kills):
    """The job's lines and the kills, each stamped with its arrival (s since the job's start)."""
    os.makedirs(folder, exist_ok=True)
    stamped = sorted(lines + [(k, "=== SIGKILL") for k in kills])
    with open(os.path.join(folder, name), "w") as f:
        f.writelines(f"{at:9.3f} {line}\n" for at, line in stamped)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--period", type=float, default=10.0, help="seconds between faults")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warm-spare", action="store_true",
                   help="launcher --warm-spare, in both jobs: replacements forked from a loaded "
                        "copy of ddp_train")
    p.add_argument("--keep-logs", metavar="DIR",
                   help="each job's lines, stamped as they arrived, to DIR/<round>-<kind>.log")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more ddp_train options")
    args = p.parse_args()
    print("| round | fault-free s | storm s | goodput | fault-free CPU s | storm CPU s | "
          "CPU goodput | faults | epochs exactly once | workers' CPU s, fault-free / storm "
          "(of it: lost workers', and those lost before they joined) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    every, costs = [], []
    for r in range(args.rounds):
        result = {}
        for kind in (["clean", "storm"] if r % 2 == 0 else ["storm", "clean"]):
            with tempfile.TemporaryDirectory() as out:
                wall, cpu, code, lines, kills, steps = run_job(
                    args, out, args.period if kind == "storm" else 0)
                if code != 0:
                    tail = "\n".join(line for _, line in lines[-30:])
                    sys.exit(f"the {kind} job ended {code}:\n{tail}")
                result[kind] = (wall, cpu, kills, exactly_once(out), worker_cpu(lines))
                if args.keep_logs:
                    keep(args.keep_logs, f"{r}-{kind}.log", lines, kills)
                if kind == "storm":
                    every += phases(lines, kills, args.workers)
                    costs += fault_costs(steps, kills, min(5.0, args.period / 2))
        (clean, clean_cpu, _, _, (clean_workers, _, _)) = result["clean"]
        (storm, storm_cpu, kills, (good, epochs), (workers, lost, wasted)) = result["storm"]
        print(f"| {r} | {clean:.1f} | {storm:.1f} | {clean / storm:.2f} | {clean_cpu:.1f} | "
              f"{storm_cpu:.1f} | {clean_cpu / storm_cpu:.2f} | {len(kills)} | "
              f"{good} of {epochs} | {clean_workers:.1f} / {workers:.1f} ({lost:.1f}, "
              f"{wasted:.1f}) |", flush=True)
    print("\n| phase (s a fault) | median | min-max | faults with the mark |")
    print("|---|---|---|---|")
    for name in ("detect", "shrink", "start", "grow"):
        values = [f[name] for f in every if f[name] is not None]
        if values:
            print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-"
                  f"{max(values):.2f} | {len(values)} of {len(every)} |")
    if costs:
        window = min(5.0, args.period / 2)
        print(f"\nA fault's cost within the storm run (training lost in the {window:g} s after "
              f"the kill against the {window:g} s before it; {len(costs)} faults): median "
              f"{statistics.median(costs):.2f} s, mean {statistics.mean(costs):.2f}, "
              f"min-max {min(costs):.2f}-{max(costs):.2f}")


if __name__ == "__main__":
    main()
