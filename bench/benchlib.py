"""What the comparison drivers share: starting the ranks of a job with torchrun's env contract, and
interleaved rounds."""
import os
import socket
import statistics
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """The processes whose parent is `pid` (a launcher's ranks)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def descendants(pid):
    """Every process below `pid` (its children, theirs, ...): the ranks under a launcher or under
    mpirun's daemon."""
    out, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children(p)]
        out += below
        frontier = below
    return out


def proc_kb(pid, file, key):
    """The kB figure `key` ("Pss:", "VmRSS:") of /proc/<pid>/<file>; None once it has ended."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def env_job(cmd, world, timeout=900, extra_env=None):
    """Runs `world` ranks of `cmd` on this host (`extra_env` on top of this process's
    environment); returns rank 0's stdout; exits on any failure."""
    port = free_port()
    procs = []
    for rank in range(world):
        # USE_LIBUV=0 unless set, as the launcher does: Debian's PyTorch 2.6 has no libuv store.
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   USE_LIBUV=os.environ.get("USE_LIBUV", "0"))
        env.update(extra_env or {})
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{cmd[0]} failed: exit codes {[p.returncode for p in procs]}")
    return outs[0]


def interleaved_rounds(ours, python, rounds, label):
    """Runs ours() and python() (each returning samples/s) `rounds` times, alternating which goes
    first so that neither always meets a cold or a warm machine; prints each round to stderr.
    Returns (median ours, median python, median ratio, min ratio, max ratio), ratios taken within
    a round."""
    a, b, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            x = ours()
            y = python()
        else:
            y = python()
            x = ours()
        a.append(x)
        b.append(y)
        ratios.append(x / y)
        print(f"{label} round {r}: ours {x:.1f} python {y:.1f} ratio {x / y:.2f}", file=sys.stderr)
    return statistics.median(a), statistics.median(b), statistics.median(ratios), min(ratios), max(ratios)
