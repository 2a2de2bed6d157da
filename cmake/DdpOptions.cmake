# Every option of the project, in one place. All are prefixed DDP_.
option(DDP_BUILD_TESTS "Build the GoogleTest suite and register it with ctest" ON)
option(DDP_BUILD_BENCH "Build the benchmark programs in bench/" ON)
option(DDP_WARNINGS_AS_ERRORS "Treat warnings in project code as errors" OFF)
set(DDP_PYTHON "/usr/bin/python3" CACHE FILEPATH
    "Python with PyTorch, used as the reference by tests and benchmarks (Debian's python3-torch)")
set(DDP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist" CACHE PATH
    "Directory holding the Fashion-MNIST .gz IDX files (Debian's dataset-fashion-mnist)")
