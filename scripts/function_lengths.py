#!/usr/bin/env python3
"""The longest functions of src/ and launch/, from universal-ctags' line ranges.

Usage: function_lengths.py SOURCE_DIR [--max N] [--top K] [--ctags PATH]
Prints the K longest functions (lines from signature to closing brace). With --max, exits 1
naming every function longer than N lines, except the declarative tables listed below: a reader
scans them as a table, and splitting them would only scatter it.
"""
import argparse
import json
import subprocess
import sys

# Qualified name -> why it may be long.
TABLES = {
    "ddp::train::make_keys": "the table of every config key: name, help, setter, getter",
    "ddp::launch::options": "the table of every launcher option: name, alias, hint, help, setter",
}


def functions(source_dir, ctags):
    out = subprocess.run(
        [ctags, "--output-format=json", "--fields=+ne", "--c++-kinds=f", "--languages=C++",
         "-R", "-o", "-", "src", "launch"],
        cwd=source_dir, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if "end" not in tag or tag["name"].startswith("__anon"):
            continue  # lambdas are counted in their function
        # Anonymous namespaces show as __anon... scopes: drop them from the name.
        scope = "::".join(p for p in tag.get("scope", "").split("::") if not p.startswith("__anon"))
        name = f"{scope}::{tag['name']}" if scope else tag["name"]
        yield tag["end"] - tag["line"] + 1, f"{tag['path']}:{tag['line']}", name


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("source_dir")
    parser.add_argument("--max", type=int, default=0)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--ctags", default="ctags", help="universal-ctags (JSON output)")
    args = parser.parse_args()
    found = sorted(functions(args.source_dir, args.ctags), reverse=True)
    for lines, where, name in found[:args.top]:
        print(f"{lines:4d}  {name}  ({where}){'  [table]' if name in TABLES else ''}")
    if args.max <= 0:
        return 0
    too_long = [f for f in found if f[0] > args.max and f[2] not in TABLES]
    for lines, where, name in too_long:
        print(f"function_lengths: {where}: {name} has {lines} lines, more than {args.max}",
              file=sys.stderr)
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
