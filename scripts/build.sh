#!/usr/bin/env bash
# Installs the dependencies (Debian packages) and builds the project (Release, ninja) into
# ${DDP_BUILD_DIR:-build}. Extra arguments go to cmake's configure step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${DDP_BUILD_TYPE:-Release}" "$@"
cmake --build "$build"
