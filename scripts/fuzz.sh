#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang; ASan, UBSan) into ${DDP_FUZZ_BUILD_DIR:-build-fuzz}
# and runs each for ${DDP_FUZZ_SECONDS:-30} seconds, starting from its seed corpus in
# tests/fuzz/corpus/<target>/ (copied: the corpus in the tree stays as committed). Exits non-zero
# on a crash, a leak, undefined behaviour, an input slower than 10 s or above 4 GiB; the input
# that did it is left in the working directory as crash-*, leak-*, timeout-* or oom-*.
# The runs are seeded (${DDP_FUZZ_SEED:-1}), so that CI repeats the same inputs; set another seed
# to explore further. Usage: scripts/fuzz.sh [target ...]   (default: idx csv config checkpoint)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${DDP_FUZZ_SECONDS:-30}"
seed="${DDP_FUZZ_SEED:-1}"
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(idx csv config checkpoint)

cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build"

# One target per core at a time (CI's two cores fuzz two readers at once); each one's report is
# printed whole when it ends.
fuzz_one() {
  local target="$1" work status
  work="$(mktemp -d)"
  cp -r "$root/tests/fuzz/corpus/$target/." "$work/"
  echo "fuzz_$target: ${seconds} s from $(ls "$work" | wc -l) seed(s)"
  # -fork would survive a finding and go on; one process stops at the first, which is what CI wants.
  (cd "$build" && LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp" "./fuzz_$target" "$work" -max_total_time="$seconds" -seed="$seed" -timeout=10 \
    -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 >"$work.log" 2>&1)
  status=$?
  tail -n 25 "$work.log"
  rm -f "$work.log"
  rm -rf "$work"
  if [[ $status -ne 0 ]]; then
    echo "fuzz_$target found a problem (exit $status); the input is in $build" >&2
    return 1
  fi
}
export -f fuzz_one
export root build seconds seed
printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'fuzz_one "$1" > "$2/fuzz_$1.out" 2>&1; s=$?; cat "$2/fuzz_$1.out"; exit $s' _ {} "$build"
