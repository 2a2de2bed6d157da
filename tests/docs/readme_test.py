#!/usr/bin/env python3
"""The doc test: runs every sh and python code block of README.md and of the docs pages that
hold commands (DOCUMENTS, in that order: a page's blocks may use what an earlier one made) that
can run here, in order, from the source root, and checks docs/training.md's config reference
against `ddp_train --help`.

A block that cannot run here (Docker, Kubernetes, several nodes, the test command itself)
is preceded by a line `<!-- doc-test: skip: <why> -->`; the reason is printed. A batch script
is preceded by `<!-- doc-test: sbatch OPTIONS : ARGS -->`: it runs as a job of a throw-away
one-host Slurm cluster (tests/scripts/slurm_cluster.sh, started for the block and stopped after
it whatever happens), submitted from the source root with `sbatch --wait OPTIONS script ARGS`.
OPTIONS adapt only the counts (nodes, tasks) to this host: they override the script's #SBATCH
lines (the node has 4 fake GPUs, a GRES without devices, so --gpus-per-node=4 stands); ARGS
reach the script as "$@" (epochs, samples; the MLP for the ResNet-18, whose evaluation of the
test set alone takes 40 s on two CPU ranks: the job's plumbing is what is tested). The job must
exit 0 and its output show
that training finished (ddp_train's final "done: ..., test accuracy" line). Anything else
runs as written, except that `build/` means the build directory being tested. Exit 1 when a
block fails or the reference and --help disagree.

Usage: readme_test.py SOURCE_DIR BUILD_DIR [--only-options] [--only REGEX]
  --only REGEX  run only the blocks whose marker line or code matches REGEX (e.g. --only sbatch)
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

BLOCK_TIMEOUT_S = 420
# The README, then the pages its sections moved to, in the order the README once held them.
DOCUMENTS = ["README.md", "docs/install.md", "docs/training.md", "docs/library.md",
             "docs/launching.md", "docs/kubernetes.md", "docs/observing.md",
             "docs/troubleshooting.md"]
REFERENCE = "docs/training.md"  # the ddp_train reference tables
SKIP = re.compile(r"<!--\s*doc-test:\s*skip:\s*(.+?)\s*-->")
SBATCH = re.compile(r"<!--\s*doc-test:\s*sbatch\s+(.*?)\s*-->")
# Variables of an outer launcher or job: sbatch passes the environment on to the job, where they
# would name another rendezvous or allocation than this cluster's.
FOREIGN_ENV = re.compile(r"^(SLURM_|SBATCH_|SRUN_|MASTER_ADDR$|MASTER_PORT$|RANK$|WORLD_SIZE$|"
                         r"LOCAL_RANK$|LOCAL_WORLD_SIZE$)")


def code_blocks(text):
    """(line number, language, code, skip reason or None, marker line or None) of each fenced
    block."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start = fence.group(1), fence.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        # The marker sits on one of the two lines above the fence.
        reason = marker = None
        for above in lines[max(0, start - 2):start]:
            if SKIP.search(above):
                reason = SKIP.search(above).group(1)
            if "doc-test:" in above:
                marker = above.strip()
        blocks.append((start + 1, language, "\n".join(body), reason, marker))
        i += 1
    return blocks


def help_options(build):
    out = subprocess.run([os.path.join(build, "ddp_train"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    return set(re.findall(r"^\s+(?:-\w, )?--([\w-]+)", out, re.M))


def reference_options(text):
    """The ddp_train options named in the first cell of the reference tables."""
    section = text[text.index("## ddp_train"):text.index("## Time series")]
    options = set()
    for row in re.findall(r"^\|([^|]*)\|", section, re.M):
        options |= set(re.findall(r"`--([\w-]+)", row))
    return options


def check_options(text, build):
    documented, actual = reference_options(text), help_options(build)
    ok = True
    for name in sorted(actual - documented):
        print(f"{REFERENCE}: option --{name} of ddp_train --help is missing from the reference")
        ok = False
    for name in sorted(documented - actual):
        print(f"{REFERENCE}: option --{name} is in the reference but not in ddp_train --help")
        ok = False
    print(f"config reference: {len(documented)} options, {'as' if ok else 'unlike'} --help")
    return ok


def with_build_dir(source, build, code):
    """`code` with build/ meaning the build directory being tested."""
    if build != os.path.join(source, "build"):
        code = re.sub(r"(?<![\w/.])build/", build + "/", code)
    return code


def sbatch_spec(marker):
    """(sbatch options, script args) of a `doc-test: sbatch OPTIONS : ARGS` marker; None."""
    match = SBATCH.search(marker or "")
    if not match:
        return None
    words = shlex.split(match.group(1))
    if ":" not in words:
        return words, []
    i = words.index(":")
    return words[:i], words[i + 1:]


def tail(text, lines=40):
    return "\n".join(text.rstrip().split("\n")[-lines:])


def cluster(action, directory):
    """tests/scripts/slurm_cluster.sh ACTION DIRECTORY (start: watched by this process, so that the
    cluster is stopped even when this test is killed): (exit code, output)."""
    argv = ["bash", os.path.join(os.path.dirname(__file__), "..", "scripts", "slurm_cluster.sh"),
            action, directory] + ([str(os.getpid())] if action == "start" else [])
    try:
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=90)
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"").decode(errors="replace")
    return result.returncode, result.stdout


def submit(source, conf, tmp, script, options, args):
    """sbatch --wait of `script` on the cluster of `conf`: (why it failed or None, output)."""
    env = {k: v for k, v in os.environ.items() if not FOREIGN_ENV.match(k)}
    env.update(SLURM_CONF=conf)
    job_out = os.path.join(tmp, "job.out")
    argv = ["sbatch", "--wait", "--output", job_out] + options + [script] + args
    try:
        result = subprocess.run(argv, cwd=source, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S)
        code, sbatch_output = result.returncode, result.stdout
    except subprocess.TimeoutExpired as e:
        code, sbatch_output = "timeout", (e.stdout or b"").decode(errors="replace")
    job = ""
    if os.path.exists(job_out):
        job = open(job_out, encoding="utf-8", errors="replace").read()
    output = f"$ {shlex.join(argv)}\n{sbatch_output}--- the job's output ---\n{job}"
    if code != 0:
        return f"sbatch --wait: {code}", output
    if not re.search(r"\] done: .*test accuracy", job):
        return "the job's output shows no finished training ('done: ... test accuracy')", output
    return None, output


def run_sbatch_block(source, build, where, code, options, args):
    """The block as a batch job of a throw-away cluster, stopped whatever happens."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="readme-slurm-") as tmp:
        directory, script = os.path.join(tmp, "cluster"), os.path.join(tmp, "job.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(with_build_dir(source, build, code) + "\n")
        why, output = None, ""
        try:
            status, output = cluster("start", directory)
            why = "the Slurm cluster did not start" if status != 0 else None
            if why is None:
                why, output = submit(source, os.path.join(directory, "slurm.conf"), tmp, script,
                                     options, args)
        finally:
            status, stopped = cluster("stop", directory)
            if status != 0:
                why, output = "stopping the Slurm cluster failed", output + "\n" + stopped
    seconds = time.monotonic() - start
    if why is not None:
        print(f"{where}: sbatch block failed ({why}) after {seconds:.0f} s:")
        print(code)
        print("--- its output (last 40 lines) ---")
        print(tail(output))
        return False
    print(f"{where}: sbatch block ran as a Slurm job in {seconds:.1f} s "
          f"(sbatch {shlex.join(options)} script {shlex.join(args)})")
    return True


def run_block(source, build, where, language, code):
    code = with_build_dir(source, build, code)
    if language == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-c", "set -euo pipefail\n" + code]
    # `python3` in a block is the Python with PyTorch this test runs on (DDP_PYTHON).
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env = dict(os.environ, DDP_BUILD_DIR=build, PATH=path)
    start = time.monotonic()
    try:
        result = subprocess.run(argv, cwd=source, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S,
                                start_new_session=True)
        code_, output = result.returncode, result.stdout
    except subprocess.TimeoutExpired as e:
        code_, output = "timeout", (e.stdout or b"").decode(errors="replace")
    seconds = time.monotonic() - start
    if code_ != 0:
        print(f"{where}: {language} block failed ({code_}) after {seconds:.0f} s:")
        print(code)
        print("--- its output (last 40 lines) ---")
        print(tail(output))
        return False
    print(f"{where}: {language} block ran in {seconds:.1f} s")
    return True


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    def read(name):
        return open(os.path.join(source, name), encoding="utf-8").read()
    ok = check_options(read(REFERENCE), build)
    if "--only-options" in sys.argv:
        sys.exit(0 if ok else 1)
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    ran = skipped = 0
    for name in DOCUMENTS:
        for line, language, code, reason, marker in code_blocks(read(name)):
            if language not in ("sh", "bash", "python"):
                continue
            if only is not None and not re.search(only, (marker or "") + "\n" + code):
                continue
            where = f"{name}:{line}"
            if reason:
                print(f"{where}: {language} block skipped: {reason}")
                skipped += 1
                continue
            spec = sbatch_spec(marker)
            if spec is not None:
                ok = run_sbatch_block(source, build, where, code, *spec) and ok
            else:
                ok = run_block(source, build, where, language, code) and ok
            ran += 1
    print(f"doc test: {ran} blocks run, {skipped} skipped")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
