#!/usr/bin/env bash
# The README's second command: install, build, and run every test through ctest; then the unit
# and multi-rank tests again under ASan and UBSan (scripts/sanitize.sh; DDP_SANITIZE_TESTS=0:
# skip), and fuzz the input readers for ${DDP_FUZZ_SECONDS:-15} s each (scripts/fuzz.sh; 0: no
# fuzzing). Exits non-zero when anything fails. Extra arguments go to ctest (e.g. -R Config).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/build.sh" -DDDP_BUILD_TESTS=ON -DDDP_WARNINGS_AS_ERRORS=ON
(cd "$build" && ctest --output-on-failure -j "$(nproc)" "$@")
if [[ "${DDP_SANITIZE_TESTS:-1}" != 0 ]]; then
  # The MPI tests' second run under the sanitizers costs 4 minutes of CI's 40: by hand only.
  DDP_SANITIZE_MPI="${DDP_SANITIZE_MPI:-0}" "$root/scripts/sanitize.sh"
fi
# 15 s per reader here, of CI's 40 minutes; scripts/fuzz.sh alone fuzzes 30 s by default.
export DDP_FUZZ_SECONDS="${DDP_FUZZ_SECONDS:-15}"
if [[ "$DDP_FUZZ_SECONDS" != 0 ]]; then
  "$root/scripts/fuzz.sh"
fi
