#!/usr/bin/env bash
# Gathers, on a Debian machine with its package archive, everything a GPU machine that has only a
# CUDA PyTorch wheel (CUDA LibTorch, NCCL, nvcc, CMake, ninja, Python) lacks to build and test ddp:
# the C++ libraries ddp links besides LibTorch, GoogleTest, and the Fashion-MNIST files. They are
# Debian's packages, downloaded with `apt-get download` and unpacked with `dpkg -x` into one
# folder (default: gpu-kit/ in the repository, which git ignores), small enough to carry to such a
# machine (about 45 MiB; the data is 30 of it). scripts/test-gpu.sh builds against it there.
#
# Usage: scripts/gpu-kit.sh [DIR]
#   DDP_GLOO_SOURCE  a checkout of gloo (github.com/pytorch/gloo) at the commit the wheel's PyTorch
#                    was built with: its headers go into the kit (gloo/include), with the config.h
#                    PyTorch's Linux CUDA wheels configure, and test-gpu.sh builds the gloo and shm
#                    backends with them (two ranks sharing a GPU on gloo: tests OneGpu.*)
#
# Not in the kit, on purpose:
# - LibTorch, CUDA and NCCL: the wheel's own are used, so that the process holds one of each.
# - gloo's headers, unless DDP_GLOO_SOURCE names them: ProcessGroupGloo inside the wheel's
#   libtorch was compiled against the gloo of that PyTorch release; Debian's gloo snapshot is a
#   different one. Wheels that ship no gloo headers build no gloo backend without them.
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

# gloo's headers and the config.h that gloo's CMake would write for PyTorch's Linux CUDA wheels
# (CUDA on; TCP transport only; gloo's float16 as c10::Half). ddp includes what c10d's
# ProcessGroupGloo.hpp includes, whose classes hold gloo's only behind pointers.
gloo_commit=""
if [ -n "${DDP_GLOO_SOURCE:-}" ]; then
  [ -f "$DDP_GLOO_SOURCE/gloo/config.h.in" ] || {
    echo "gpu-kit: DDP_GLOO_SOURCE=$DDP_GLOO_SOURCE is no gloo checkout (no gloo/config.h.in)" >&2
    exit 2
  }
  mkdir -p "$kit/gloo/include"
  (cd "$DDP_GLOO_SOURCE" && find gloo -name '*.h' -exec cp --parents {} "$kit/gloo/include" \;)
  sed -E -e 's/@GLOO_VERSION_(MAJOR|MINOR|PATCH)@/GLOO_VERSION_\1_VALUE/' \
    -e 's/^#cmakedefine01 (GLOO_USE_CUDA|GLOO_HAVE_TRANSPORT_TCP|GLOO_USE_TORCH_DTYPES)$/#define \1 1/' \
    -e 's/^#cmakedefine01 ([A-Z_]+)$/#define \1 0/' "$DDP_GLOO_SOURCE/gloo/config.h.in" |
    sed -e "s/GLOO_VERSION_MAJOR_VALUE/$(sed -n 's/^set(GLOO_VERSION_MAJOR \([0-9]*\))/\1/p' "$DDP_GLOO_SOURCE/CMakeLists.txt")/" \
      -e "s/GLOO_VERSION_MINOR_VALUE/$(sed -n 's/^set(GLOO_VERSION_MINOR \([0-9]*\))/\1/p' "$DDP_GLOO_SOURCE/CMakeLists.txt")/" \
      -e "s/GLOO_VERSION_PATCH_VALUE/$(sed -n 's/^set(GLOO_VERSION_PATCH \([0-9]*\))/\1/p' "$DDP_GLOO_SOURCE/CMakeLists.txt")/" \
      >"$kit/gloo/include/gloo/config.h"
  gloo_commit="$(git -C "$DDP_GLOO_SOURCE" rev-parse --short HEAD 2>/dev/null || echo "unknown commit")"
fi

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
  if [ -n "$gloo_commit" ]; then
    echo
    echo "gloo's headers (gloo/include) from $DDP_GLOO_SOURCE at $gloo_commit, and the config.h"
    echo "written for PyTorch's Linux CUDA wheels."
  fi
} >"$kit/README.md"

echo "gpu-kit: $(du -sh "$kit" | cut -f1) in $kit (${#packages[@]} packages; see $kit/README.md)"
