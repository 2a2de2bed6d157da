#!/usr/bin/env bash
# The GPU suite, on a machine that has a CUDA PyTorch wheel (torch 2.x with CUDA, its NCCL), a
# compiler, CMake and ninja, and no Debian packages: builds ddp against the wheel's LibTorch, CUDA
# and NCCL (one NCCL in the process: the one libtorch_cuda.so loads), with the rest from the kit
# that scripts/gpu-kit.sh gathers on a Debian machine, then runs the tests labelled gpu.
#
# Usage: scripts/test-gpu.sh [ctest arguments]
#   DDP_GPU_KIT      the kit (default: gpu-kit/ in the repository)
#   DDP_BUILD_DIR    the build (default: build-gpu/)
#   DDP_PYTHON       the Python whose torch to build against (default: python3 on PATH)
#   DDP_TORCH_PREFIX where TorchConfig.cmake is (default: that torch's cmake_prefix_path)
#   DDP_GPU_SUITE    gpu (default): the tests labelled gpu; all: every test but those that install
#                    Debian packages (the README's doc test)
#
# Where the wheel's torch sees a GPU, the nccl backend must build (-DDDP_NCCL=ON), so the GPU tests
# cannot skip for want of it. Where it sees none (a CPU check of this script), they skip and say so.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="$(realpath -m "${DDP_GPU_KIT:-$root/gpu-kit}")"
build="${DDP_BUILD_DIR:-$root/build-gpu}"
python="${DDP_PYTHON:-$(command -v python3 || true)}"
suite="${DDP_GPU_SUITE:-gpu}"

die() {
  echo "test-gpu: $*" >&2
  exit 2
}

[ -d "$kit/usr/include" ] || die "no kit at $kit: run scripts/gpu-kit.sh on a Debian machine and \
carry the folder here (or set DDP_GPU_KIT)"
[ -n "$python" ] || die "no python3 on PATH (set DDP_PYTHON)"
case "$suite" in gpu | all) ;; *) die "DDP_GPU_SUITE must be gpu or all, not '$suite'" ;; esac
for tool in cmake ninja c++; do
  command -v "$tool" >/dev/null || die "no $tool on PATH"
done

# What this machine's torch is. One line of `key=value` pairs, read below.
facts="$("$python" - <<'EOF'
import os, torch
cuda = torch.cuda.is_available()
nccl = ""
try:
    import nvidia.nccl  # the wheel's NCCL: site-packages/nvidia/nccl/{include,lib}
    nccl = list(nvidia.nccl.__path__)[0]
except ImportError:
    pass
print(f"version={torch.__version__} cuda={torch.version.cuda or ''} gpus={torch.cuda.device_count() if cuda else 0} "
      f"abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)} prefix={torch.utils.cmake_prefix_path} nccl_root={nccl}")
for i in range(torch.cuda.device_count() if cuda else 0):
    p = torch.cuda.get_device_properties(i)
    print(f"# gpu {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}")
EOF
)" || die "$python cannot import torch"
echo "$facts" | sed -n 's/^# /test-gpu: /p'
fact() { echo "$facts" | head -1 | tr ' ' '\n' | sed -n "s/^$1=//p"; }
echo "test-gpu: torch $(fact version), CUDA $(fact cuda), $(fact gpus) GPU(s) visible"
if [ "$(fact gpus)" -eq 1 ]; then
  # NCCL refuses two ranks on one GPU: said here too, so that a green run on one GPU is not read
  # as a two-GPU pass.
  echo "test-gpu: one GPU: the two-GPU tests (TwoGpus.*) will skip, saying so; they need two"
fi

# Debian's libraries in the kit are built with the C++11 ABI; so are PyTorch's wheels since 2.7.
[ "$(fact abi)" = 1 ] || die "torch $(fact version) uses the pre-C++11 ABI, the kit's libraries \
the C++11 one: use a torch >= 2.7 wheel or the cxx11-abi LibTorch zip (DDP_TORCH_PREFIX)"

torch_prefix="${DDP_TORCH_PREFIX:-$(fact prefix)}"
cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=ON
            "-DCMAKE_PREFIX_PATH=$torch_prefix;$kit/usr"
            "-DDDP_PYTHON=$python"
            "-DDDP_FASHION_MNIST_DIR=$kit/usr/share/datasets/fashion-mnist")
# The kit's packages, by their CMake configs (an arch-qualified lib dir, as Debian lays it out).
arch_lib="$(find "$kit/usr/lib" -mindepth 1 -maxdepth 1 -type d -name '*-linux-gnu*' | head -1)"
[ -n "$arch_lib" ] || die "$kit/usr/lib has no <arch>-linux-gnu folder: remake the kit"
cmake_args+=("-Dfmt_DIR=$arch_lib/cmake/fmt" "-Dspdlog_DIR=$arch_lib/cmake/spdlog"
             "-Dyaml-cpp_DIR=$arch_lib/cmake/yaml-cpp" "-DGTest_DIR=$arch_lib/cmake/GTest"
             "-Dcxxopts_DIR=$kit/usr/lib/cmake/cxxopts"
             "-DZLIB_INCLUDE_DIR=$kit/usr/include" "-DZLIB_LIBRARY=$arch_lib/libz.so")
# gloo's headers where the kit has them (DDP_GLOO_SOURCE of gpu-kit.sh): the wheels ship none.
if [ -f "$kit/gloo/include/gloo/algorithm.h" ]; then
  cmake_args+=("-DDDP_GLOO_INCLUDE_DIR=$kit/gloo/include")
fi
# The kit's headers as -I, which the compiler searches before every -isystem folder: a torch 2.x
# wheel ships its own fmt headers (a newer fmt) in its include folder, and fmt's headers must be
# those of the libfmt and libspdlog that are linked. yaml-cpp's config names no include folder.
cmake_args+=("-DCMAKE_CXX_FLAGS=-I$kit/usr/include")

if [ "$(fact gpus)" -gt 0 ]; then
  # LibTorch's CMake config looks for the CUDA toolkit: nvcc on PATH, CUDA_HOME, or the usual place.
  nvcc="${CUDACXX:-$(command -v nvcc || true)}"
  [ -n "$nvcc" ] || nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
  [ -x "$nvcc" ] || die "a GPU but no nvcc (PATH, CUDACXX, CUDA_HOME): LibTorch's CMake config needs the CUDA toolkit"
  cuda_home="$(cd "$(dirname "$nvcc")/.." && pwd)"
  echo "test-gpu: CUDA toolkit $cuda_home ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  # One architecture, the GPU's own: LibTorch's config otherwise builds flags for a list of them.
  arch="$("$python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$arch}"
  cmake_args+=(-DDDP_NCCL=ON "-DCMAKE_CUDA_COMPILER=$nvcc" "-DCUDAToolkit_ROOT=$cuda_home"
               "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_home" "-DCMAKE_CUDA_ARCHITECTURES=${arch/./}")
  if [ -n "$(fact nccl_root)" ]; then
    cmake_args+=("-DDDP_NCCL_ROOT=$(fact nccl_root)")
  fi
else
  echo "test-gpu: no GPU visible to torch: the nccl backend builds only if this LibTorch has CUDA, \
and the GPU tests will skip, saying why"
fi

cmake -S "$root" -B "$build" "${cmake_args[@]}"
cmake --build "$build"

# One NCCL in the process: the library ddp links is the one libtorch_cuda.so loads.
if [ "$(fact gpus)" -gt 0 ]; then
  torch_lib="$(dirname "$(dirname "$torch_prefix")")/lib/libtorch_cuda.so"
  ours="$(ldd "$build/ddp_train" | awk '/libnccl/ {print $3}')"
  theirs="$(ldd "$torch_lib" 2>/dev/null | awk '/libnccl/ {print $3}')"
  echo "test-gpu: libnccl of ddp_train: ${ours:-none}; of libtorch_cuda.so: ${theirs:-none}"
  if [ -n "$ours" ] && [ -n "$theirs" ] && [ "$(realpath "$ours")" != "$(realpath "$theirs")" ]; then
    die "two NCCLs in one process ($ours, $theirs): set DDP_NCCL_ROOT to the one LibTorch loads"
  fi
fi
"$build/ddp_train" --version
"$build/ddp_train" --list-devices || true

cd "$build"
if [ "$suite" = gpu ]; then
  # Verbose: a skipped test says why only in its output.
  ctest --output-on-failure --no-tests=error -V -L gpu "$@"
else
  # The doc test runs scripts/run.sh, which installs Debian packages.
  ctest --output-on-failure --no-tests=error -j "$(nproc)" -E '^Docs\.' "$@"
fi
