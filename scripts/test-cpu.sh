#!/usr/bin/env bash
# The CPU seconds that tests cost: runs ctest in a build directory with the arguments given (a
# test's name as -R REGEX, a label as -L ...) and prints the seconds of wall time and the CPU
# seconds of every process the tests started (scripts/lib/stage.sh), as CI's stages count them.
# What a new test adds to CI is this figure, once for Debian 12 and once more for Debian 13 where
# it is labelled both-platforms (docs/design.md, "Build and CI time").
#
#   scripts/test-cpu.sh [-B BUILD_DIR] CTEST_ARGUMENTS...   (default BUILD_DIR: build)
#   scripts/test-cpu.sh -R '^Ci\.'
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build"
if [[ "${1:-}" == -B ]]; then
  build="$2"
  shift 2
fi
[[ $# -gt 0 ]] || { echo "usage: $0 [-B BUILD_DIR] CTEST_ARGUMENTS... (e.g. -R '^Ci\\.')" >&2; exit 2; }
# shellcheck source=scripts/lib/stage.sh
source "$root/scripts/lib/stage.sh"
stage "ctest $*" ctest --test-dir "$build" --output-on-failure "$@"
