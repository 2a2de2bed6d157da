#!/usr/bin/env bash
# The README's test command on the second platform, Debian 13 (trixie: LibTorch and PyTorch 2.6,
# GCC 14, Open MPI 5), from this machine: a trixie root made with mmdebstrap (cached between runs
# in DDP_TRIXIE_ROOT, default /var/cache/ddp/trixie-root), a fresh clone of this repository's
# HEAD inside it, and scripts/test.sh run there, which installs trixie's packages itself, builds
# every target with warnings as errors, and runs the tests whose outcome the platform can change:
# those labelled both-platforms (docs/design.md, "Build and CI time", has the rule; Debian 12 runs
# every test). /proc, /sys, /dev, /dev/pts and /dev/shm are mounted for the run and unmounted
# whatever happens. Needs root. Extra arguments go to ctest.
#
#   scripts/test-trixie.sh --prepare   only makes the root and installs the packages into it (CI
#                                      does this while Debian 12 builds)
#   scripts/test-trixie.sh --full      every test, as Debian 12 runs them
#   scripts/test-trixie.sh --run CMD   CMD (bash) in the clone there, after the packages, nothing
#                                      else: a benchmark against PyTorch 2.6 (bench/compare_fsdp.py)
#
# The sanitizer and fuzzing stages, which Debian 12 runs, are off here by default:
# DDP_TRIXIE_SANITIZE=1 and DDP_TRIXIE_FUZZ_SECONDS=N turn them on (the root then gets clang, which
# it otherwise goes without: DDP_INSTALL_CLANG=0 in scripts/install-deps.sh). The workflow lint
# runs on the host only (DDP_INSTALL_NPM=0 here: see scripts/install-deps.sh). The build is at -O1
# (DDP_TRIXIE_RELEASE_FLAGS, default "-O1 -DNDEBUG", for scripts/build.sh's DDP_RELEASE_FLAGS):
# GCC 14 compiles every target in three quarters of the CPU seconds of -O3, and Debian 12's build
# keeps the -O3 that users' builds have (docs/design.md, "Build and CI time").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/debian-root.sh
source "$root/scripts/lib/debian-root.sh"
chroot_dir="${DDP_TRIXIE_ROOT:-/var/cache/ddp/trixie-root}"

[ "$(id -u)" -eq 0 ] || { echo "test-trixie: needs root (mmdebstrap, chroot, mounts)" >&2; exit 2; }

debian_root_make trixie "$chroot_dir"
debian_root_clone "$chroot_dir" "$root"
sanitize="${DDP_TRIXIE_SANITIZE:-0}" fuzz_seconds="${DDP_TRIXIE_FUZZ_SECONDS:-0}"
install_clang=0
[[ "$sanitize" == 0 && "$fuzz_seconds" == 0 ]] || install_clang=1
if [[ "${1:-}" == --run ]]; then
  [ $# -eq 2 ] || { echo "test-trixie: --run takes one command" >&2; exit 2; }
  debian_root_run "$chroot_dir" "cd /work/ddp && DDP_INSTALL_NPM=0 DDP_INSTALL_CLANG=0 \
    scripts/install-deps.sh && $2"
  exit 0
fi
if [[ "${1:-}" == --prepare ]]; then
  debian_root_run "$chroot_dir" "cd /work/ddp && DDP_INSTALL_NPM=0 DDP_INSTALL_CLANG=$install_clang \
    scripts/install-deps.sh"
  exit 0
fi
echo "test-trixie: scripts/test.sh on $(sed -n 's/^PRETTY_NAME="\(.*\)"$/\1/p' "$chroot_dir/etc/os-release"), \
commit $(git -C "$root" rev-parse --short HEAD)"
ctest_args=(-L both-platforms)
if [[ "${1:-}" == --full ]]; then
  ctest_args=()
  shift
fi
ctest_args+=("$@")
debian_root_run "$chroot_dir" "cd /work/ddp && DDP_INSTALL_NPM=0 DDP_INSTALL_CLANG=$install_clang \
  DDP_SANITIZE_TESTS=$(printf '%q' "$sanitize") DDP_FUZZ_SECONDS=$(printf '%q' "$fuzz_seconds") \
  DDP_RELEASE_FLAGS=$(printf '%q' "${DDP_TRIXIE_RELEASE_FLAGS:--O1 -DNDEBUG}") \
  scripts/test.sh $(printf '%q ' "${ctest_args[@]}")"
