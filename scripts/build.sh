#!/usr/bin/env bash
# Installs the dependencies (Debian packages) and builds the project (Release, ninja) into
# ${DDP_BUILD_DIR:-build}. Extra arguments go to cmake's configure step. DDP_RELEASE_FLAGS, where
# set, replaces the Release build's optimisation flags (CMake's -O3 -DNDEBUG): scripts/test-trixie.sh
# builds Debian 13's at -O1 (docs/design.md, "Build and CI time").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh"
release_flags=()
if [[ -n "${DDP_RELEASE_FLAGS:-}" ]]; then
  release_flags=(-DCMAKE_CXX_FLAGS_RELEASE="$DDP_RELEASE_FLAGS" -DCMAKE_C_FLAGS_RELEASE="$DDP_RELEASE_FLAGS")
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DDP_BUILD_TYPE:-Release}" \
  "${release_flags[@]}" "$@"
cmake --build "$build"
