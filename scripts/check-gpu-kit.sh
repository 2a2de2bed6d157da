#!/usr/bin/env bash
# Checks scripts/gpu-kit.sh and scripts/test-gpu.sh without a GPU: a Debian 12 root that has a
# compiler, CMake, ninja and a LibTorch with its Python (Debian's, standing in for a wheel), and
# none of the libraries the kit brings, builds ddp with the kit alone and runs the GPU suite,
# whose tests then skip, saying why. What a GPU adds (CUDA, nvcc, NCCL) is left to a GPU machine.
#
# Usage (as root): scripts/check-gpu-kit.sh   (DDP_CHECK_ROOT: where the root is cached)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/debian-root.sh
source "$root/scripts/lib/debian-root.sh"
chroot_dir="${DDP_CHECK_ROOT:-/var/cache/ddp/gpu-kit-check-root}"

[ "$(id -u)" -eq 0 ] || { echo "check-gpu-kit: needs root (chroot, mounts)" >&2; exit 2; }
[ -d "$root/gpu-kit" ] || "$root/scripts/gpu-kit.sh"

debian_root_make bookworm "$chroot_dir" \
  build-essential cmake ninja-build git python3 python3-torch libtorch-dev
for dev in fmt spdlog yaml-cpp gtest; do
  if [ -e "$chroot_dir/usr/include/$dev" ]; then
    echo "check-gpu-kit: the root has $dev's headers of its own: the check would prove nothing" >&2
    exit 1
  fi
done

# A fresh clone with the kit, as it would travel to a GPU machine.
debian_root_clone "$chroot_dir" "$root"
cp -a "$root/gpu-kit" "$chroot_dir/work/ddp/gpu-kit"
debian_root_run "$chroot_dir" "cd /work/ddp && \
  DDP_TORCH_PREFIX=/usr/lib/x86_64-linux-gnu/cmake scripts/test-gpu.sh"
