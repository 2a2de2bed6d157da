# Every option of the project, in one place. All are prefixed DDP_.
option(DDP_BUILD_TESTS "Build the GoogleTest suite and register it with ctest" ON)
option(DDP_BUILD_BENCH "Build the benchmark programs in bench/" ON)
option(DDP_WARNINGS_AS_ERRORS "Treat warnings in project code as errors" OFF)
set(DDP_PYTHON "/usr/bin/python3" CACHE FILEPATH
    "Python with PyTorch, used as the reference by tests and benchmarks (Debian's python3-torch)")
set(DDP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist" CACHE PATH
    "Directory holding the Fashion-MNIST .gz IDX files (Debian's dataset-fashion-mnist)")
option(DDP_GLOO "Build the gloo backend where gloo's headers are found" ON)
option(DDP_MPI "Build the MPI backend where MPI is found" ON)
set(DDP_NCCL "AUTO" CACHE STRING
    "NCCL backend: AUTO (where LibTorch has CUDA and NCCL is found), ON (fail otherwise), OFF")
set_property(CACHE DDP_NCCL PROPERTY STRINGS AUTO ON OFF)
set(DDP_NCCL_ROOT "" CACHE PATH
    "Prefix of the NCCL to use (include/nccl.h, lib/libnccl.so*). Default search: $ENV{NCCL_ROOT}, \
the PyTorch wheel's site-packages/nvidia/nccl, the CUDA toolkit, /usr")

# A translation unit that includes LibTorch costs seconds even with the precompiled header (loading
# it, instantiating the same templates again); a unity build compiles the sources of a target in
# batches, each batch one translation unit. docs/design.md has the figures.
option(DDP_UNITY_BUILD "Compile each LibTorch target's sources in batches (CMake's unity build)" ON)
set(DDP_UNITY_BATCH_SIZE 32 CACHE STRING "Sources per batch of the unity build")

set(DDP_SANITIZE "" CACHE STRING
    "Sanitizers for every target, as -fsanitize= takes them (e.g. address,undefined); \"\": none. \
scripts/sanitize.sh builds and runs the unit and multi-rank tests this way")
