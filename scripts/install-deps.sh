#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages, and nothing from anywhere else.
# Idempotent: a second run finds everything present and only checks.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libgloo-dev
  libopenmpi-dev openmpi-bin
  libcxxopts-dev libspdlog-dev libfmt-dev libgtest-dev libyaml-cpp-dev zlib1g-dev
  dataset-fashion-mnist
  python3 python3-torch python3-numpy python3-yaml python3-matplotlib
  libopenblas0-openmp
  clang libclang-rt-14-dev
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
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
