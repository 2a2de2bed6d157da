#!/usr/bin/env python3
"""Runs a GoogleTest program with a time limit on each of its tests and one on the whole program,
and names the test that runs past its limit: for the test programs that run outside ctest (the
sanitizer stage, scripts/sanitize.sh), where `timeout` alone would say only that the program was
killed, not which test hung or how long it ran.

    gtest_limits.py --per-test S --total S PROGRAM [ARGUMENTS...]

The program's output is passed through as GoogleTest's --gtest_brief=1 prints it (its own
"[ RUN ]" and "[ OK ]" lines left out; a failure, its messages and everything the tests print
kept): this script reads the "[ RUN ]" lines to know which test is running, so the program must
not be given --gtest_brief=1 itself. A test past S seconds, or the program past its total, ends
the program and every process it started (its process group: it runs in a session of its own)
with this line, and exit status 124, as `timeout` exits:

    gtest_limits: ddp_comm_tests: Worlds/GlooRanks.X/2 ran 601 s, past its limit of 600 s
    (the program ran 1004 s); killed

Otherwise the exit status is the program's (a signal N as 128 + N).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

RUN = re.compile(r"^\[ RUN      \] (\S+)")
ENDED = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] ")


class Watch:
    """What the reader saw last (the running test, since when), shared with the watchdog."""

    def __init__(self):
        self.lock = threading.Lock()
        self.test = None
        self.since = None


def read_output(stream, watch, out):
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        run = RUN.match(line)
        with watch.lock:
            if run:
                watch.test, watch.since = run.group(1), time.monotonic()
                continue
            if ENDED.match(line):
                watch.test = None
        if not line.startswith("[       OK ] "):
            out.write(line)
            out.flush()


def past_limit(watch, started, per_test, total):
    """The line naming what ran past its limit, or None while everything is within it."""
    now = time.monotonic()
    with watch.lock:
        test, since = watch.test, watch.since
    if test is not None and now - since > per_test:
        return f"{test} ran {now - since:.0f} s, past its limit of {per_test:.0f} s"
    if now - started > total:
        what = f"{test} was running ({now - since:.0f} s)" if test else "no test was running"
        return f"the program ran past its limit of {total:.0f} s; {what}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-test", type=float, required=True, help="seconds a test may run")
    parser.add_argument("--total", type=float, required=True, help="seconds the program may run")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if not args.command:
        parser.error("no program given")
    name = os.path.basename(args.command[0])
    started = time.monotonic()
    proc = subprocess.Popen(args.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    watch = Watch()
    reader = threading.Thread(target=read_output, args=(proc.stdout, watch, sys.stdout),
                              daemon=True)
    reader.start()
    while proc.poll() is None:
        why = past_limit(watch, started, args.per_test, args.total)
        if why is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # Ranks that left the group may still hold the pipe: their output is not waited for.
            reader.join(timeout=5)
            print(f"gtest_limits: {name}: {why} (the program ran "
                  f"{time.monotonic() - started:.0f} s); killed", flush=True)
            return 124
        time.sleep(0.2)
    reader.join(timeout=5)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


if __name__ == "__main__":
    sys.exit(main())
