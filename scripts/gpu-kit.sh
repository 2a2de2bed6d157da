#!/usr/bin/env bash
# Gathers, on a Debian machine with its package archive, everything a GPU machine that has only a
# CUDA PyTorch wheel (CUDA LibTorch, NCCL, nvcc, CMake, ninja, Python) lacks to build and test ddp:
# the C++ libraries ddp links besides LibTorch, GoogleTest, and the Fashion-MNIST files. They are
# Debian's packages, downloaded with `apt-get download` and unpacked with `dpkg -x` into one
# folder (default: gpu-kit/ in the repository, which git ignores), small enough to carry to such a
# machine (about 45 MiB; the data is 30 of it). scripts/test-gpu.sh builds against it there.
#
# Usage: scripts/gpu-kit.sh [DIR]
#
# Not in the kit, on purpose:
# - LibTorch, CUDA and NCCL: the wheel's own are used, so that the process holds one of each.
# - gloo's headers: ProcessGroupGloo inside the wheel's libtorch was compiled against the gloo of
#   that PyTorch release; Debian's gloo snapshot is a different one. Recent wheels ship their
#   own gloo headers, and without them the gloo backend is simply not built.
# - Open MPI: about 40 MiB with its dependencies, and the runs that need it (mpirun with NCCL)
#   need two GPUs, i.e. a machine that can install it from its own packages.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="$(realpath -m "${1:-$root/gpu-kit}")"

# What ddp links besides LibTorch, with the development files that CMake finds; Fashion-MNIST.
dev_packages=(libcxxopts-dev libspdlog-dev libfmt-dev libyaml-cpp-dev zlib1g-dev
              libgtest-dev libgmock-dev)
data_packages=(dataset-fashion-mnist)

# The shared libraries behind a -dev package: those of its dependencies that are named after it
# (libspdlog-dev -> libspdlog1.10, zlib1g-dev -> zlib1g, libgtest-dev -> googletest's sources).
# Asked of the archive, so the names follow the Debian release this runs on.
runtime_of() {
  local stem="${1%-dev}"
  apt-cache depends "$1" | awk '/^ +Depends: [a-z]/ {print $2}' |
    grep -E "^(${stem}[0-9.]*|googletest)$" || true
}

if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "gpu-kit: needs a Debian machine (apt-get, dpkg)" >&2
  exit 2
fi
packages=("${dev_packages[@]}" "${data_packages[@]}")
for p in "${dev_packages[@]}"; do
  mapfile -t more < <(runtime_of "$p")
  packages+=("${more[@]}")
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt-get download fetches as the user _apt where it can write
echo "gpu-kit: downloading ${packages[*]}"
if ! (cd "$work" && apt-get download -q "${packages[@]}" >/dev/null); then
  # A fresh machine's package lists may be empty: fill them once, then try again.
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -q >/dev/null
  (cd "$work" && apt-get download -q "${packages[@]}" >/dev/null)
fi

rm -rf "$kit"
mkdir -p "$kit"
for deb in "$work"/*.deb; do
  dpkg -x "$deb" "$kit"
done
# Debian 12 still puts some libraries under /lib (zlib): one tree under usr/, as on a merged-/usr
# system, so that a prefix (kit/usr) finds them all.
if [ -d "$kit/lib" ]; then
  cp -a "$kit/lib/." "$kit/usr/lib/"
  rm -rf "${kit:?}/lib"
fi
# Absolute symbolic links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would point into the
# host's /usr wherever the kit is unpacked: point them inside the kit, relatively.
while IFS= read -r -d '' link; do
  target="$(readlink "$link")"
  [[ "$target" == /* ]] || continue
  target="/usr${target#/usr}"
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$kit$target")" "$link"
done < <(find "$kit" -type l -print0)
rm -rf "$kit/usr/share/doc" "$kit/usr/share/man" "$kit/usr/share/lintian"

{
  echo "# ddp's GPU kit"
  echo
  echo "Made by scripts/gpu-kit.sh on $(date -u +%Y-%m-%d) from $(. /etc/os-release && echo "$PRETTY_NAME")'s"
  echo "packages (apt-get download, dpkg -x), for scripts/test-gpu.sh on a machine that has a CUDA"
  echo "PyTorch wheel and nothing else: the C++ libraries ddp links besides LibTorch (cxxopts, spdlog"
  echo "and fmt, yaml-cpp, zlib), GoogleTest, and Fashion-MNIST (usr/share/datasets/fashion-mnist)."
  echo "LibTorch, CUDA and NCCL are the wheel's own. Carry this folder with the repository."
  echo
  echo "| package | version |"
  echo "|---|---|"
  for deb in "$work"/*.deb; do
    echo "| $(dpkg-deb -f "$deb" Package) | $(dpkg-deb -f "$deb" Version) |"
  done
} >"$kit/README.md"

echo "gpu-kit: $(du -sh "$kit" | cut -f1) in $kit (${#packages[@]} packages; see $kit/README.md)"
