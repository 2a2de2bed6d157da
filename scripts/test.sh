#!/usr/bin/env bash
# The README's second command: install, build, and run every test through ctest, then fuzz the
# input readers for ${DDP_FUZZ_SECONDS:-30} s each (scripts/fuzz.sh; 0: no fuzzing).
# Exits non-zero when anything fails. Extra arguments go to ctest (e.g. -R Config).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/build.sh" -DDDP_BUILD_TESTS=ON -DDDP_WARNINGS_AS_ERRORS=ON
(cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@")
if [[ "${DDP_FUZZ_SECONDS:-30}" != 0 ]]; then
  "$root/scripts/fuzz.sh"
fi
