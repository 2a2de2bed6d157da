#!/usr/bin/env bash
# The second compiler and the sanitizers, in one build: everything (the library, the programs,
# every test and benchmark) compiled with Debian's clang, warnings as errors, AddressSanitizer and
# UndefinedBehaviorSanitizer, into ${DDP_SANITIZE_BUILD_DIR:-build-sanitize}; then the unit and
# multi-rank tests (process groups, DDP, SyncBatchNorm with real ranks over gloo, shared memory and
# MPI) run under the sanitizers, and the shared-memory transport's tests under ThreadSanitizer
# (${DDP_TSAN_BUILD_DIR:-build-tsan}). A finding in any process (a test, or a rank it starts) makes
# it exit non-zero, so its test fails. Leaks inside LibTorch and Open MPI are not ours:
# tests/sanitize/lsan.supp.
#
# The code must build with both compilers Debian ships: GCC builds and tests the Release build
# (scripts/test.sh), clang this one. It is also the build without stack traces
# (DDP_WITH_STACKS=OFF: libunwind and libdw are optional, and that path must compile and say so):
# the stack tests run here and skip, saying why.
#
# Run by scripts/test.sh unless DDP_SANITIZE_TESTS=0 (there without the MPI tests,
# DDP_SANITIZE_MPI=0, to keep CI within its time). Extra arguments go to every test program.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
"$root/scripts/install-deps.sh"  # clang is one of the packages
# shellcheck source=scripts/lib/ccache.sh
source "$root/scripts/lib/ccache.sh"
ddp_ccache_setup "$root"  # where DDP_CCACHE_ROOT names a cache (CI's)
# Through the cache where there is one, with the precompiled header: a LibTorch source costs clang
# 11 s without it and 3.6 s with it. A cold build of everything here: 475 CPU s without, 267 with
# (docs/design.md, "Build and CI time"). clang's header holds the build directory's absolute path,
# so its users are not served from the cache in a clone elsewhere: a warm run compiles them again.
# -O0 -g0: the least compile time; clang's warnings do not depend on it (GCC's flow-based ones do,
# which is why GCC's build is the Release one). For file and line in the sanitizers' stack
# traces: DDP_SANITIZE_FLAGS="-O0 -g1".
flags="${DDP_SANITIZE_FLAGS:--O0 -g0}"
# Linked by lld: GNU ld took 100 of this build's CPU seconds to link its programs with the
# sanitizers' runtimes (a link is never cached), lld a fifth of that.
lld=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld
     -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${lld[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="$flags" -DCMAKE_C_FLAGS_RELEASE="$flags" \
  -DDDP_SANITIZE=address,undefined -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=ON \
  -DDDP_WARNINGS_AS_ERRORS=ON -DDDP_WITH_STACKS=OFF >/dev/null
cmake --build "$build"
echo "sanitize: $(clang++ --version | head -1): everything compiled, no warning"

asan="strict_init_order=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
# A limit of $1 seconds, or less where CI's deadline (scripts/test.sh) comes sooner.
limit() {
  local seconds="$1" left
  if [[ -n "${DDP_CI_DEADLINE:-}" ]]; then
    left=$((DDP_CI_DEADLINE - $(date +%s)))
    ((left >= seconds)) || seconds=$((left > 1 ? left : 1))
  fi
  echo "$seconds"
}
# Without stack traces the tests that need them skip, saying why; the others pass.
if ! ASAN_OPTIONS="$asan" python3 "$root/scripts/lib/gtest_limits.py" --per-test "$(limit 120)" \
    --total "$(limit 300)" "$build/ddp_stacks_tests" |
    grep -E "no stack traces|SKIPPED|PASSED|FAILED|gtest_limits"; then
  echo "ddp_stacks_tests failed without stack traces" >&2
  status=1
fi
# $1: the program, $2: the leak check (1/0), $3: the gtest filter; then the script's arguments.
run() {
  local target="$1" leaks="$2" filter="$3"
  shift 3
  echo "== $target $filter (ASan, UBSan$([[ $leaks == 1 ]] && echo ", LSan"))"
  # Each test bounds its own processes; these limits bound each test (ctest's longest) and the
  # program, so that nothing can hang CI, and a test past its limit is named with its seconds.
  if ! ASAN_OPTIONS="$asan:detect_leaks=$leaks" python3 "$root/scripts/lib/gtest_limits.py" \
      --per-test "$(limit 600)" --total "$(limit 1200)" "$build/$target" --gtest_filter="$filter" "$@"; then
    echo "$target failed under the sanitizers" >&2
    status=1
  fi
}
# The MLP's full epoch (Training.Mlp*) trains inside LibTorch, which is not instrumented: 25 s
# of CI's time for little; the Linear demo runs the trainer under the sanitizers instead.
# A test on MPI has Mpi in its name, or mpi in its parameter's (Backends/...mpi_world2).
for target in ddp_unit_tests ddp_comm_tests ddp_ddp_tests ddp_sync_bn_tests ddp_shm_tests; do
  run "$target" 1 "-*Mpi*:*mpi*:Training.Mlp*" "$@"
  # Open MPI's components (dlopen'ed, unloaded at MPI_Finalize) leave allocations whose stacks
  # end in unloaded code, which no suppression can name: the MPI tests run without the leak
  # check, with ASan's and UBSan's other checks. DDP_SANITIZE_MPI=0 leaves them out (CI's time).
  if [[ "${DDP_SANITIZE_MPI:-1}" != 0 ]]; then
    run "$target" 0 "*Mpi*:*mpi*" "$@"
  fi
done
# The shared-memory transport's own tests under ThreadSanitizer too (its memory ordering): there
# its ranks are threads of one process, and the program has no LibTorch, whose uninstrumented
# threads ThreadSanitizer could not follow. A build of its own (one small target, about a minute).
tsan="${DDP_TSAN_BUILD_DIR:-$root/build-tsan}"
cmake -S "$root" -B "$tsan" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g0" \
  -DDDP_SANITIZE=thread -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=OFF -DDDP_WARNINGS_AS_ERRORS=ON >/dev/null
# The group's thread (src/comm/job_thread.h), whose waiters may run their collective themselves,
# with it.
cmake --build "$tsan" --target ddp_shm_tests ddp_job_thread_tests
for target in ddp_shm_tests ddp_job_thread_tests; do
  echo "== $target (TSan)"
  if ! TSAN_OPTIONS="halt_on_error=1" python3 "$root/scripts/lib/gtest_limits.py" \
      --per-test "$(limit 120)" --total "$(limit 600)" "$tsan/$target" "$@"; then
    echo "$target failed under ThreadSanitizer" >&2
    status=1
  fi
done
exit $status
