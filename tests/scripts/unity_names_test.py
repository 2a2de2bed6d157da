#!/usr/bin/env python3
"""No two sources of one unity batch define a file-local function of the same name.

A unity batch (CMake's unity build, DDP_UNITY_BUILD) is one translation unit: its sources' anonymous
namespaces are one namespace. Two file-local functions of one name with different parameters are
then an overload set, and a call in one file can silently take the other file's function: a test
of the fault runs called the checkpoint tests' `linear_job(out, {}, fault)`, whose second
parameter, an int, took `{}`, and ran ddp_train without the fault options. Such a pair compiles;
this test names it. It reads each batch's generated source (`#include "FILE"` lines) in the build
directory and each file's functions from universal-ctags: those in an anonymous namespace (within
a named one or not) or in none (macros such as TEST, upper case, left out).

Usage: unity_names_test.py BUILD_DIR CTAGS
"""
import collections
import glob
import json
import os
import re
import subprocess
import sys


def file_local_functions(path, ctags):
    out = subprocess.run([ctags, "--output-format=json", "--fields=+sKS", "--kinds-c++=f",
                          "--languages=C++", "--language-force=C++", "-f", "-", path],
                         capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        tag = json.loads(line)
        name, scope = tag["name"], tag.get("scope", "")
        if name.startswith("__anon") or name.isupper():
            continue  # a lambda; a macro such as TEST
        if scope and (tag.get("scopeKind") != "namespace" or
                      not scope.split("::")[-1].startswith("__anon")):
            continue  # a member, or a function of a named namespace (declared in a header)
        # Its name as the batch sees it: the anonymous namespaces of one batch are one.
        names.add("::".join([part for part in scope.split("::") if not part.startswith("__anon")] +
                            [name]))
    return names


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    build, ctags = sys.argv[1], sys.argv[2]
    batches = sorted(glob.glob(os.path.join(build, "**", "Unity", "unity_*.cxx"), recursive=True))
    if not batches:
        print(f"no unity batch under {build}: is DDP_UNITY_BUILD off?")
        return 1
    clashes = 0
    for batch in batches:
        with open(batch) as f:
            sources = re.findall(r'^#include "([^"]+)"', f.read(), re.M)
        where = collections.defaultdict(list)
        for source in sources:
            for name in file_local_functions(source, ctags):
                where[name].append(source)
        for name, files in sorted(where.items()):
            if len(files) > 1:
                clashes += 1
                print(f"{os.path.relpath(batch, build)}: `{name}` is file-local in each of "
                      f"{', '.join(files)}: rename one")
    print(f"{len(batches)} unity batches, {clashes} names defined in two of a batch's files")
    return 1 if clashes else 0


if __name__ == "__main__":
    sys.exit(main())
