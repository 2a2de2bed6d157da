#!/usr/bin/env bash
# The README's second command: install, build (GCC, Release, warnings as errors), and run every
# test through ctest; then everything again with clang, and the unit and multi-rank tests under
# ASan and UBSan in that build (scripts/sanitize.sh; DDP_SANITIZE_TESTS=0: skip), and fuzz the
# input readers for ${DDP_FUZZ_SECONDS:-15} s each (scripts/fuzz.sh; 0: no fuzzing). Exits non-zero
# when anything fails; prints each stage's minutes and CPU seconds.
#
# DDP_TEST_TIER=fast: the tests labelled `fast` only (ctest -L fast: pure functions and quick
# single-process runs, a few minutes), without the sanitizer and fuzzing stages; the default,
# `full`, is everything, as CI runs it. Extra arguments go to ctest (e.g. -R Cli).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"
# shellcheck source=scripts/lib/stage.sh
source "$root/scripts/lib/stage.sh"
# Builds through ccache where DDP_CCACHE_ROOT names a cache (CI's: see .ci/run).
ddp_ccache_setup "$root"
# OpenMP's threads wait for work by sleeping, not spinning: the tests run more ranks and
# threads than this machine has cores (2-4 ranks a test, two tests at once on CI's two cores), and
# a spinning thread takes the core another rank needs. Measured on CI's machine: 16 % fewer CPU
# seconds and 17 % less time for eight training tests (docs/design.md, "Build and CI time"). It
# changes how threads wait, never what they compute.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tier="${DDP_TEST_TIER:-full}"
case "$tier" in
  fast) tier_args=(-L fast) ;;
  full) tier_args=() ;;
  *) echo "test.sh: DDP_TEST_TIER must be fast or full, not '$tier'" >&2; exit 2 ;;
esac

stage "install and build" "$root/scripts/build.sh" -DDDP_BUILD_TESTS=ON -DDDP_WARNINGS_AS_ERRORS=ON
# ctest starts the longest tests first when it knows their times (its cost data, which a build
# directory keeps from its last run). A fresh clone gets those of a CI run (tests/ctest-costs.txt,
# Debian 12): else the hosts tests, which share one lock, and the two that take both cores run last,
# one at a time, while the other core idles (about 3 minutes of CI's ctest). A test missing from
# the file only runs in another order.
costs="$build/Testing/Temporary/CTestCostData.txt"
if [[ ! -f "$costs" ]]; then
  mkdir -p "$(dirname "$costs")"
  cp "$root/tests/ctest-costs.txt" "$costs"
fi
# CI's deadline (DDP_CI_DEADLINE, seconds since the epoch, set by .ci/run): a test still running
# then times out and is named, with its seconds, by ctest, instead of CI cutting the whole run.
# ctest takes the time of day, in local time (a time already past it takes as tomorrow's).
deadline_args=()
if [[ -n "${DDP_CI_DEADLINE:-}" ]]; then
  if (( DDP_CI_DEADLINE <= $(date +%s) )); then
    echo "test.sh: CI's deadline ($(date -d "@$DDP_CI_DEADLINE")) passed before ctest began" >&2
    exit 1
  fi
  deadline_args=(--stop-time "$(date -d "@$DDP_CI_DEADLINE" +%H:%M:%S)")
fi
stage "ctest ($tier${*:+: $*})" bash -c 'cd "$1" && shift && ctest --output-on-failure -j "$(nproc)" "$@"' \
  ctest "$build" "${deadline_args[@]}" "${tier_args[@]}" "$@"
[[ "$tier" == full ]] || exit 0
if [[ "${DDP_SANITIZE_TESTS:-1}" != 0 ]]; then
  # The MPI tests' second run under the sanitizers costs 4 minutes of CI's 40: by hand only.
  stage "clang build and sanitizers" env DDP_SANITIZE_MPI="${DDP_SANITIZE_MPI:-0}" "$root/scripts/sanitize.sh"
fi
# 15 s per reader here, of CI's 40 minutes; scripts/fuzz.sh alone fuzzes 30 s by default.
export DDP_FUZZ_SECONDS="${DDP_FUZZ_SECONDS:-15}"
if [[ "$DDP_FUZZ_SECONDS" != 0 ]]; then
  stage "fuzzing" "$root/scripts/fuzz.sh"
fi
