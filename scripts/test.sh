#!/usr/bin/env bash
# The README's second command: install, build, and run every test through ctest.
# Exits non-zero when anything fails. Extra arguments go to ctest (e.g. -R Config).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/build.sh" -DDDP_BUILD_TESTS=ON -DDDP_WARNINGS_AS_ERRORS=ON
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
