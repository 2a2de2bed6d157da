#!/usr/bin/env bash
# CI's compiler cache (scripts/lib/ccache.sh) can never make a build pass that a clean build would
# fail, nor give a program other than a clean build's. On a project built the way ddp's LibTorch
# targets are (tests/ccache/toy: a reused precompiled header, unity batches), with CI's settings,
# from an empty cache:
# - a copy in another directory (a fresh clone elsewhere) is served whole from the cache, and its
#   program prints the same, with no path of the first copy (__FILE__ is relative to the tree);
# - a change to a header behind the precompiled header, or to a header of a unity batch, is
#   compiled anew, and the program prints the change;
# - an error in a header fails the build, the second time as the first;
# - back at the first text, the cache serves the first objects again: the changes' objects stood
#   beside them and replaced none.
# Usage: tests/scripts/ccache_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# This test's own cache and settings, whatever the run around it uses (CI's builds go through
# ccache too, with their own tree's prefix map).
unset CCACHE_DIR CCACHE_BASEDIR CCACHE_NOHASHDIR CCACHE_SLOPPINESS CXXFLAGS CFLAGS \
  CMAKE_C_COMPILER_LAUNCHER CMAKE_CXX_COMPILER_LAUNCHER
export DDP_CCACHE_ROOT="$tmp/cache"
# shellcheck source=scripts/lib/ccache.sh
source "$src/scripts/lib/ccache.sh"

fail() { echo "FAIL: $*" >&2; exit 1; }

# build DIR: configures (the first time) and builds DIR through the cache; prints
# "<hits> <misses>" of the build. Returns the build's status.
build() (
  local dir=$1 before after status=0
  ddp_ccache_setup "$dir" >/dev/null
  before=$(ddp_ccache_counts)
  [[ -d "$dir/build" ]] || cmake -S "$dir" -B "$dir/build" -G Ninja >"$tmp/configure.log" 2>&1 ||
    { cat "$tmp/configure.log" >&2; exit 1; }
  cmake --build "$dir/build" >"$tmp/build.log" 2>&1 || status=$?
  after=$(ddp_ccache_counts)
  echo "$before $after" | awk '{print $4 - $1, $5 - $2}'
  return $status
)

# expect DIR WANT_HITS WANT_MISSES OUTPUT: builds DIR and checks the counts ('+': at least one)
# and what its program prints.
expect() {
  local dir=$1 want_hits=$2 want_misses=$3 want_output=$4 counts hits misses output
  counts=$(build "$dir") || { cat "$tmp/build.log" >&2; fail "the build of $dir failed"; }
  read -r hits misses <<<"$counts"
  [[ $want_hits == + ]] && { [[ $hits -gt 0 ]] || fail "$dir: no hit ($counts)"; }
  [[ $want_hits == 0 ]] && { [[ $hits -eq 0 ]] || fail "$dir: $hits hits, none wanted"; }
  [[ $want_misses == + ]] && { [[ $misses -gt 0 ]] || fail "$dir: no miss: a change was not compiled"; }
  [[ $want_misses == 0 ]] && { [[ $misses -eq 0 ]] || fail "$dir: $misses misses, none wanted"; }
  output=$("$dir/build/toy")
  [[ "$output" == "$want_output" ]] || fail "$dir prints '$output', not '$want_output'"
  echo "ok: $dir: $hits hits, $misses misses, prints '$output'"
}

cp -r "$src/tests/ccache/toy" "$tmp/first"
expect "$tmp/first" 0 + "one 1 ./main.cpp"
cp -r "$src/tests/ccache/toy" "$tmp/second"
expect "$tmp/second" + 0 "one 1 ./main.cpp"

sed -i 's/"one"/"two"/' "$tmp/second/in_pch.h"
expect "$tmp/second" 0 + "two 1 ./main.cpp"
sed -i 's/PLAIN_VALUE 1/PLAIN_VALUE 2/' "$tmp/second/plain.h"
expect "$tmp/second" 0 + "two 2 ./main.cpp"

echo "#error a broken header" >>"$tmp/second/plain.h"
for attempt in first second; do
  if build "$tmp/second" >/dev/null; then fail "a header with an error built ($attempt time)"; fi
  grep -q "a broken header" "$tmp/build.log" || { cat "$tmp/build.log" >&2; fail "no compiler error"; }
  echo "ok: a broken header fails the build ($attempt time)"
done

# In a fresh build directory, as CI's clone has: in one that holds a precompiled header already,
# ccache counts that file among the inputs of the header's own compilation (a miss, never a wrong
# hit).
cp "$src/tests/ccache/toy/in_pch.h" "$src/tests/ccache/toy/plain.h" "$tmp/second/"
rm -rf "$tmp/second/build"
expect "$tmp/second" + 0 "one 1 ./main.cpp"
echo "ccache_test: the cache served only what a clean build gives"
