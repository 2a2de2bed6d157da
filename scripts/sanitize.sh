#!/usr/bin/env bash
# Builds the unit tests and the multi-rank tests (process groups, DDP, SyncBatchNorm with real
# ranks over gloo, shared memory and MPI) with AddressSanitizer and UndefinedBehaviorSanitizer
# (-DDDP_SANITIZE) into ${DDP_SANITIZE_BUILD_DIR:-build-sanitize}, the shared-memory transport's
# tests with ThreadSanitizer into ${DDP_TSAN_BUILD_DIR:-build-tsan}, and runs them. A finding in
# any process (a test, or a rank it starts) makes it exit non-zero, so its test fails. Leaks
# inside LibTorch and Open MPI are not ours: tests/sanitize/lsan.supp. Run by scripts/test.sh unless
# DDP_SANITIZE_TESTS=0 (there without the MPI tests, DDP_SANITIZE_MPI=0, to keep CI within its
# time). Extra arguments go to every test program.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
targets=(ddp_unit_tests ddp_comm_tests ddp_ddp_tests ddp_sync_bn_tests ddp_shm_tests)

# -O0 -g0: the least compile time (CI's 40 minutes); reports name the functions. For file and
# line in the stack traces: DDP_SANITIZE_FLAGS="-O0 -g1".
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="${DDP_SANITIZE_FLAGS:--O0 -g0}" -DDDP_SANITIZE=address,undefined \
  -DDDP_BUILD_TESTS=ON -DDDP_BUILD_BENCH=OFF -DDDP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build "$build" --target "${targets[@]}"

asan="strict_init_order=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
# $1: the program, $2: the leak check (1/0), $3: the gtest filter; then the script's arguments.
run() {
  local target="$1" leaks="$2" filter="$3"
  shift 3
  echo "== $target $filter (ASan, UBSan$([[ $leaks == 1 ]] && echo ", LSan"))"
  # Each test bounds its own processes; this bounds the program, so nothing can hang CI.
  if ! ASAN_OPTIONS="$asan:detect_leaks=$leaks" timeout 1200 "$build/$target" --gtest_brief=1 \
      --gtest_filter="$filter" "$@"; then
    echo "$target failed under the sanitizers" >&2
    status=1
  fi
}
# The MLP's full epoch (Training.Mlp*) trains inside LibTorch, which is not instrumented: 25 s
# of CI's time for little; the Linear demo runs the trainer under the sanitizers instead.
# A test on MPI has Mpi in its name, or mpi in its parameter's (Backends/...mpi_world2).
for target in "${targets[@]}"; do
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
cmake --build "$tsan" --target ddp_shm_tests
echo "== ddp_shm_tests (TSan)"
if ! TSAN_OPTIONS="halt_on_error=1" timeout 600 "$tsan/ddp_shm_tests" --gtest_brief=1 "$@"; then
  echo "ddp_shm_tests failed under ThreadSanitizer" >&2
  status=1
fi
exit $status
