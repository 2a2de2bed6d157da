# The NCCL backend (src/comm/backends/nccl_backend.cpp). Three outcomes, decided by ddp_configure_nccl():
#   built         LibTorch has CUDA and NCCL (nccl.h + libnccl) is found: the backend is compiled
#                 into the comm library and DDP_HAVE_NCCL is set.
#   compile-only  LibTorch has no CUDA (Debian's 1.13) but a CUDA toolkit's headers and nccl.h are
#                 here (e.g. /usr/local/cuda): the source is compiled, never linked, as the object
#                 library ddp_nccl_compile_check, part of `all`, so that CI keeps it compiling.
#   not built     neither; the reason is printed.

# The project root, from where this file lives (not PROJECT_SOURCE_DIR: also usable from a
# standalone check project).
get_filename_component(_ddp_nccl_project_dir "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# ddp_configure_nccl(<comm_target>): builds the NCCL backend into <comm_target> where possible
# (see above) and sets DDP_HAVE_NCCL (ON/OFF) in the caller's scope.
function(ddp_configure_nccl comm_target)
  set(DDP_HAVE_NCCL OFF PARENT_SCOPE)
  set(source "${_ddp_nccl_project_dir}/src/comm/backends/nccl_backend.cpp")
  string(TOUPPER "${DDP_NCCL}" mode)
  if(NOT mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "ddp: DDP_NCCL must be AUTO, ON or OFF, not '${DDP_NCCL}'")
  endif()
  if(mode STREQUAL "OFF")
    message(STATUS "ddp: nccl backend: not built (DDP_NCCL=OFF)")
    return()
  endif()

  # Does LibTorch have CUDA? A CUDA LibTorch (a PyTorch wheel) exports the target torch_cuda and
  # sets CAFFE2_USE_CUDA and TORCH_CUDA_LIBRARIES; Debian's CPU build defines none of the three.
  set(torch_cuda OFF)
  if(TARGET torch_cuda OR CAFFE2_USE_CUDA OR TORCH_CUDA_LIBRARIES)
    set(torch_cuda ON)
  endif()

  # Where the CUDA toolkit is: what Torch's config found (FindCUDA in older, CUDAToolkit in newer
  # releases), the usual variables, then the usual place.
  set(cuda_roots ${CUDAToolkit_ROOT} ${CUDA_TOOLKIT_ROOT_DIR} $ENV{CUDA_HOME} $ENV{CUDA_PATH}
                 /usr/local/cuda)
  find_path(DDP_CUDA_INCLUDE_DIR cuda_runtime.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_INCLUDE_DIRS} ${cuda_roots}
            PATH_SUFFIXES include targets/x86_64-linux/include targets/sbsa-linux/include
            DOC "Directory of cuda_runtime.h (for the NCCL backend)")

  # Where NCCL is. A wheel's TORCH_INSTALL_PREFIX is site-packages/torch, and its NCCL (the one
  # libtorch_cuda.so loads, so the one to link) is site-packages/nvidia/nccl; Torch's config does
  # not add that include path itself.
  set(nccl_roots ${DDP_NCCL_ROOT} $ENV{NCCL_ROOT})
  if(TORCH_INSTALL_PREFIX AND EXISTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl")
    get_filename_component(wheel_nccl "${TORCH_INSTALL_PREFIX}/../nvidia/nccl" ABSOLUTE)
    list(APPEND nccl_roots "${wheel_nccl}")
  endif()
  list(APPEND nccl_roots ${cuda_roots} /usr)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${nccl_roots}
            PATH_SUFFIXES include targets/x86_64-linux/include targets/sbsa-linux/include
            DOC "Directory of nccl.h")
  # The wheel ships only libnccl.so.2 (no libnccl.so), hence the second name; NAMES_PER_DIR makes
  # the first root that has either win (by default CMake tries each name in every folder first,
  # and a system libnccl.so beat the wheel's libnccl.so.2: two NCCLs in one process, seen on an
  # H200 with torch 2.11).
  find_library(DDP_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${nccl_roots}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib
               DOC "The NCCL library to link (the one libtorch_cuda.so loads)")

  set(nccl_version "")
  if(DDP_NCCL_INCLUDE_DIR)
    file(STRINGS "${DDP_NCCL_INCLUDE_DIR}/nccl.h" version_lines
         REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} +([0-9]+)" unused "${version_lines}")
      list(APPEND nccl_version "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN nccl_version "." nccl_version)
  endif()

  # 1. Built for real.
  if(torch_cuda AND DDP_NCCL_INCLUDE_DIR AND DDP_NCCL_LIBRARY)
    target_sources(${comm_target} PRIVATE "${source}")
    # PRIVATE: only the factory in the same library needs to know (backends.h).
    target_compile_definitions(${comm_target} PRIVATE DDP_HAVE_NCCL)
    target_include_directories(${comm_target} SYSTEM PRIVATE "${DDP_NCCL_INCLUDE_DIR}")
    if(DDP_CUDA_INCLUDE_DIR)
      # Usually also reached through Torch's CUDA targets; explicit in case it is not.
      target_include_directories(${comm_target} SYSTEM PRIVATE "${DDP_CUDA_INCLUDE_DIR}")
    endif()
    target_link_libraries(${comm_target} PRIVATE "${DDP_NCCL_LIBRARY}")
    set(DDP_HAVE_NCCL ON PARENT_SCOPE)
    message(STATUS "ddp: nccl backend: built, NCCL ${nccl_version} "
                   "(${DDP_NCCL_INCLUDE_DIR}/nccl.h, ${DDP_NCCL_LIBRARY})")
    return()
  endif()

  if(torch_cuda)
    set(reason "LibTorch has CUDA but NCCL was not found (nccl.h: ${DDP_NCCL_INCLUDE_DIR}, \
libnccl: ${DDP_NCCL_LIBRARY}); set DDP_NCCL_ROOT or NCCL_ROOT to its prefix")
  else()
    set(reason "LibTorch has no CUDA")
  endif()
  if(mode STREQUAL "ON")
    message(FATAL_ERROR "ddp: DDP_NCCL=ON but the nccl backend cannot be built: ${reason}")
  endif()

  # 2. Compile-only, against the CUDA toolkit's headers. LibTorch must at least ship the c10/cuda
  #    headers (Debian's does); a header generated by LibTorch's own CUDA build,
  #    c10/cuda/impl/cuda_cmake_macros.h, is missing from a CPU install: supply it.
  set(torch_include_dirs ${TORCH_INCLUDE_DIRS})
  set(have_c10_cuda OFF)
  set(have_cuda_macros OFF)
  foreach(dir IN LISTS torch_include_dirs)
    if(EXISTS "${dir}/c10/cuda/CUDAStream.h")
      set(have_c10_cuda ON)
    endif()
    if(EXISTS "${dir}/c10/cuda/impl/cuda_cmake_macros.h")
      set(have_cuda_macros ON)
    endif()
  endforeach()
  if(NOT torch_cuda AND DDP_CUDA_INCLUDE_DIR AND DDP_NCCL_INCLUDE_DIR AND have_c10_cuda)
    add_library(ddp_nccl_compile_check OBJECT "${source}")
    target_compile_definitions(ddp_nccl_compile_check PRIVATE DDP_HAVE_NCCL)
    target_include_directories(ddp_nccl_compile_check PRIVATE "${_ddp_nccl_project_dir}/include"
                                                             "${_ddp_nccl_project_dir}/src/comm")
    if(TARGET ddp::torch)
      target_link_libraries(ddp_nccl_compile_check PRIVATE ddp::torch)  # usage requirements only
    else()
      target_include_directories(ddp_nccl_compile_check SYSTEM PRIVATE ${torch_include_dirs})
    endif()
    if(NOT have_cuda_macros)
      # What LibTorch's CUDA build generates for a shared c10_cuda (visibility macros only).
      set(shim_dir "${CMAKE_CURRENT_BINARY_DIR}/ddp_nccl_shim")
      file(CONFIGURE OUTPUT "${shim_dir}/c10/cuda/impl/cuda_cmake_macros.h"
           CONTENT "#pragma once\n// Generated by cmake/DdpNccl.cmake: this LibTorch has no CUDA \
build, which would have generated it.\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
      target_include_directories(ddp_nccl_compile_check SYSTEM PRIVATE "${shim_dir}")
    endif()
    target_include_directories(ddp_nccl_compile_check SYSTEM PRIVATE
                               "${DDP_CUDA_INCLUDE_DIR}" "${DDP_NCCL_INCLUDE_DIR}")
    if(COMMAND ddp_set_warnings)
      ddp_set_warnings(ddp_nccl_compile_check)
    else()
      target_compile_options(ddp_nccl_compile_check PRIVATE -Wall -Wextra)
    endif()
    message(STATUS "ddp: nccl backend: compile-only check (LibTorch has no CUDA) against "
                   "${DDP_NCCL_INCLUDE_DIR}/nccl.h")
    return()
  endif()

  # 3. Nothing.
  if(NOT torch_cuda)
    if(NOT DDP_CUDA_INCLUDE_DIR OR NOT DDP_NCCL_INCLUDE_DIR)
      string(APPEND reason ", and no CUDA toolkit headers with nccl.h to compile-check it against "
                           "(cuda_runtime.h: ${DDP_CUDA_INCLUDE_DIR}, nccl.h: ${DDP_NCCL_INCLUDE_DIR})")
    else()
      string(APPEND reason ", and its headers lack c10/cuda/CUDAStream.h for a compile-only check")
    endif()
  endif()
  message(STATUS "ddp: nccl backend: not built: ${reason}")
endfunction()
