#!/usr/bin/env python3
"""The README's doc test: runs every sh and python code block of README.md that can run here,
in order, from the source root, and checks its config reference against `ddp_train --help`.

A block that cannot run here (Docker, Slurm, Kubernetes, several nodes, the test command itself)
is preceded by a line `<!-- doc-test: skip: <why> -->`; the reason is printed. Anything else
runs as written, except that `build/` means the build directory being tested. Exit 1 when a
block fails or the reference and --help disagree.

Usage: readme_test.py SOURCE_DIR BUILD_DIR [--only-options]
"""
import os
import re
import subprocess
import sys
import time

BLOCK_TIMEOUT_S = 420
SKIP = re.compile(r"<!--\s*doc-test:\s*skip:\s*(.+?)\s*-->")


def code_blocks(text):
    """(line number, language, code, skip reason or None) of each fenced block."""
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
        reason = None
        for above in lines[max(0, start - 2):start]:
            if SKIP.search(above):
                reason = SKIP.search(above).group(1)
        blocks.append((start + 1, language, "\n".join(body), reason))
        i += 1
    return blocks


def help_options(build):
    out = subprocess.run([os.path.join(build, "ddp_train"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    return set(re.findall(r"^\s+(?:-\w, )?--([\w-]+)", out, re.M))


def readme_options(text):
    """The ddp_train options named in the first cell of the README's reference tables."""
    section = text[text.index("## ddp_train"):text.index("## Time series")]
    options = set()
    for row in re.findall(r"^\|([^|]*)\|", section, re.M):
        options |= set(re.findall(r"`--([\w-]+)", row))
    return options


def check_options(text, build):
    documented, actual = readme_options(text), help_options(build)
    ok = True
    for name in sorted(actual - documented):
        print(f"README.md: option --{name} of ddp_train --help is missing from the reference")
        ok = False
    for name in sorted(documented - actual):
        print(f"README.md: option --{name} is in the reference but not in ddp_train --help")
        ok = False
    print(f"config reference: {len(documented)} options, {'as' if ok else 'unlike'} --help")
    return ok


def run_block(source, build, line, language, code):
    if build != os.path.join(source, "build"):
        code = re.sub(r"(?<![\w/.])build/", build + "/", code)
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
        print(f"README.md:{line}: {language} block failed ({code_}) after {seconds:.0f} s:")
        print(code)
        print("--- its output (last 40 lines) ---")
        print("\n".join(output.rstrip().split("\n")[-40:]))
        return False
    print(f"README.md:{line}: {language} block ran in {seconds:.1f} s")
    return True


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    text = open(os.path.join(source, "README.md"), encoding="utf-8").read()
    ok = check_options(text, build)
    if "--only-options" in sys.argv:
        sys.exit(0 if ok else 1)
    ran = skipped = 0
    for line, language, code, reason in code_blocks(text):
        if language not in ("sh", "bash", "python"):
            continue
        if reason:
            print(f"README.md:{line}: {language} block skipped: {reason}")
            skipped += 1
            continue
        ok = run_block(source, build, line, language, code) and ok
        ran += 1
    print(f"doc test: {ran} blocks run, {skipped} skipped")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
