#!/usr/bin/env bash
# Compiles the library, the programs and every test program with Debian's clang, warnings as
# errors, into ${DDP_CLANG_BUILD_DIR:-build-clang}: the code must build with both compilers that
# Debian ships (GCC is the one scripts/test.sh builds and tests with). Compiles only, and runs
# only the stack tests, as this build is also the one without stack traces (DDP_WITH_STACKS=OFF:
# libunwind and libdw are optional, and that path must compile and say so); the tests' results
# are GCC's build's. Extra arguments go to cmake's configure step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_CLANG_BUILD_DIR:-$root/build-clang}"

"$root/scripts/install-deps.sh"  # clang is one of the packages
# shellcheck source=scripts/lib/ccache.sh
source "$root/scripts/lib/ccache.sh"
ddp_ccache_setup "$root"  # where DDP_CCACHE_ROOT names a cache (CI's)
# Through the cache, without the precompiled header: clang's holds the absolute paths of the
# build directory and is passed behind -Xclang, so no compilation that used it would be served in
# a clone elsewhere. Without it an empty cache compiles for about 7 minutes instead of 4, a warm
# one for about 1 (and every source must include what it uses, which this build checks).
pch=()
[[ -z "${CCACHE_DIR:-}" ]] || pch=(-DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON)
# -O0 -g0: the least compile time; warnings do not depend on it here (GCC's flow-based ones do,
# which is why GCC's build is the Release one).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O0 -g0" -DCMAKE_C_FLAGS_RELEASE="-O0 -g0" \
  -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=ON -DDDP_WARNINGS_AS_ERRORS=ON -DDDP_WITH_STACKS=OFF \
  "${pch[@]}" "$@" >/dev/null
cmake --build "$build"
# Without stack traces the tests that need them skip, saying why; the others pass.
"$build/ddp_stacks_tests" | grep -E "no stack traces|SKIPPED|PASSED|FAILED"
echo "clang-build: $("clang++" --version | head -1): everything compiled, no warning"
