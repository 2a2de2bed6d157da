#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages, and nothing from anywhere else.
# Idempotent: a second run finds everything present and only checks. Works on Debian 12 (bookworm)
# and Debian 13 (trixie): the one name that differs between releases is asked of the archive.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

# libFuzzer and the sanitizers' runtimes for clang (scripts/fuzz.sh) are in libclang-rt-N-dev, N
# being the release's default clang (14 on Debian 12, 19 on Debian 13).
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
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libgloo-dev
  libopenmpi-dev openmpi-bin
  libcxxopts-dev libspdlog-dev libfmt-dev libgtest-dev libyaml-cpp-dev zlib1g-dev
  dataset-fashion-mnist
  python3 python3-torch python3-numpy python3-yaml python3-matplotlib
  libopenblas0-openmp
  clang "libclang-rt-${major}-dev"
  universal-ctags
  slurmctld slurmd slurm-client munge iproute2
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
