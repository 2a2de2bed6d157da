# Finds the foreign libraries. Each is imported as a target; nothing is set globally.
find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
# JSON (flight records, metrics.jsonl, the timeline), header-only; 3.11.2 in Debian 12, 3.11.3 in 13.
find_package(nlohmann_json 3 REQUIRED)

# Torch's config exports a flat variable list; wrap it in one imported target.
if(NOT TARGET ddp::torch)
  add_library(ddp_torch INTERFACE)
  add_library(ddp::torch ALIAS ddp_torch)
  target_link_libraries(ddp_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(ddp_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
endif()

# cxxopts is header-only; Debian ships a config, other installs may not.
find_package(cxxopts QUIET)
if(NOT TARGET cxxopts::cxxopts)
  find_path(CXXOPTS_INCLUDE_DIR cxxopts.hpp REQUIRED)
  add_library(cxxopts::cxxopts INTERFACE IMPORTED)
  target_include_directories(cxxopts::cxxopts INTERFACE ${CXXOPTS_INCLUDE_DIR})
endif()

# Communication backends: gloo where its headers are (c10d's ProcessGroupGloo is in LibTorch),
# MPI where found. NCCL: cmake/DdpNccl.cmake.
find_path(DDP_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS})
if(DDP_GLOO AND DDP_GLOO_INCLUDE_DIR)
  set(DDP_HAVE_GLOO ON)
endif()
if(DDP_MPI)
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(DDP_HAVE_MPI ON)
  endif()
endif()

# Stack traces for the hang doctor (src/comm/diagnostics/stacks.cpp): libunwind walks the threads' stacks,
# libdw (elfutils) names their functions, files and lines. Both are optional: without them a rank's
# flight record comes without its stacks. DDP_WITH_STACKS=OFF builds without them where they are
# installed (scripts/sanitize.sh does, so that the build without them is compiled too).
option(DDP_WITH_STACKS "Stack traces in flight records, where libunwind and libdw are found" ON)
set(DDP_HAVE_STACKS OFF)
if(DDP_WITH_STACKS)
  find_path(DDP_LIBUNWIND_INCLUDE_DIR libunwind.h)
  find_library(DDP_LIBUNWIND_LIBRARY unwind)
  find_path(DDP_LIBDW_INCLUDE_DIR elfutils/libdwfl.h)
  find_library(DDP_LIBDW_LIBRARY dw)
  if(DDP_LIBUNWIND_INCLUDE_DIR AND DDP_LIBUNWIND_LIBRARY AND DDP_LIBDW_INCLUDE_DIR
     AND DDP_LIBDW_LIBRARY)
    set(DDP_HAVE_STACKS ON)
  endif()
endif()

# Whole gzip files (Fashion-MNIST's) through libdeflate, about 3x zlib's speed (src/data/idx.cpp);
# optional: without it zlib reads them all, as it reads the first bytes of one in either build.
option(DDP_WITH_LIBDEFLATE "Gunzip whole files with libdeflate, where it is found" ON)
set(DDP_HAVE_LIBDEFLATE OFF)
if(DDP_WITH_LIBDEFLATE)
  find_path(DDP_LIBDEFLATE_INCLUDE_DIR libdeflate.h)
  find_library(DDP_LIBDEFLATE_LIBRARY deflate)
  if(DDP_LIBDEFLATE_INCLUDE_DIR AND DDP_LIBDEFLATE_LIBRARY)
    set(DDP_HAVE_LIBDEFLATE ON)
  endif()
endif()

if(DDP_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

message(STATUS "ddp: LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX}")
