#!/usr/bin/env python3
"""Every test registered with ctest says which platforms run it: exactly one of the labels
both-platforms (Debian 12 and 13 run it) and debian12-only (Debian 13 runs it only in a full run),
as docs/design.md's "Build and CI time" rules. A new test without either fails this one, naming it.

Usage: platform_labels_test.py CTEST BUILD_DIR
"""
import json
import subprocess
import sys

PLATFORM_LABELS = {"both-platforms", "debian12-only"}


def labels_of(test):
    for prop in test.get("properties", []):
        if prop["name"] == "LABELS":
            return set(prop["value"])
    return set()


def misplaced(tests):
    """The tests whose labels name no platform or both, each with what it has."""
    found = []
    for test in tests:
        platforms = labels_of(test) & PLATFORM_LABELS
        if len(platforms) != 1:
            found.append(f"{test['name']} (labels: {', '.join(sorted(labels_of(test))) or 'none'})")
    return found


def main():
    ctest, build = sys.argv[1], sys.argv[2]
    # The check itself first: a test with neither label, and one with both, are named.
    probe = [{"name": "Fine", "properties": [{"name": "LABELS", "value": ["fast", "both-platforms"]}]},
             {"name": "Neither", "properties": [{"name": "LABELS", "value": ["fast"]}]},
             {"name": "Unlabelled"},
             {"name": "Both", "properties": [{"name": "LABELS",
                                               "value": ["both-platforms", "debian12-only"]}]}]
    if [entry.split(" ")[0] for entry in misplaced(probe)] != ["Neither", "Unlabelled", "Both"]:
        sys.exit(f"the check does not find the tests it must: {misplaced(probe)}")

    listed = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, capture_output=True,
                            text=True, timeout=600)
    if listed.returncode != 0:
        sys.exit(f"ctest --show-only failed ({listed.returncode}): {listed.stderr}")
    tests = json.loads(listed.stdout)["tests"]
    wrong = misplaced(tests)
    if wrong:
        print(f"{len(wrong)} of {len(tests)} registered tests do not say which platforms run them "
              "(PLATFORMS both or debian12 in their registration: docs/design.md, "
              "\"Build and CI time\"):")
        for entry in wrong:
            print(f"  {entry}")
        sys.exit(1)
    counts = {label: sum(label in labels_of(t) for t in tests) for label in sorted(PLATFORM_LABELS)}
    print(f"{len(tests)} tests, each with one platform label: "
          + ", ".join(f"{n} {label}" for label, n in counts.items()))


if __name__ == "__main__":
    main()
