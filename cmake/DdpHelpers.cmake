# Warning flags for project code only (foreign headers come in as SYSTEM includes).
function(ddp_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(DDP_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Every target that includes LibTorch reuses one precompiled header: a TU including
# <torch/torch.h> costs ~20 s on 2 cores, ~8 s with the PCH.
# They are also compiled in unity batches (DDP_UNITY_BUILD): the PCH is then loaded once a batch.
# ddp_use_torch_pch(target [pch_target]): the PCH of pch_target (default ddp_pch, the library's;
# the tests have one of their own, tests/CMakeLists.txt), made with the same flags as target.
function(ddp_use_torch_pch target)
  set(pch ddp_pch)
  if(ARGC GREATER 1)
    set(pch ${ARGV1})
  endif()
  target_precompile_headers(${target} REUSE_FROM ${pch})
  if(DDP_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                                               UNITY_BUILD_BATCH_SIZE ${DDP_UNITY_BATCH_SIZE})
  endif()
endfunction()

# Every test says which platforms run it, as a ctest label (docs/design.md, "Build and CI time"):
# both-platforms where its outcome can depend on LibTorch's version, the compiler or Open MPI (Debian
# 12 and 13 run it), debian12-only for the rest (Debian 13 runs it only in a full run). `value` is
# what a registration says: both or debian12.
function(ddp_platform_label what value out)
  if(value STREQUAL "both")
    set(${out} both-platforms PARENT_SCOPE)
  elseif(value STREQUAL "debian12")
    set(${out} debian12-only PARENT_SCOPE)
  else()
    message(FATAL_ERROR "${what}: PLATFORMS must be both or debian12, not '${value}' "
                        "(docs/design.md, \"Build and CI time\", says which)")
  endif()
endfunction()

# ddp_add_test(NAME name COMMAND cmd... PLATFORMS both|debian12 [TIMEOUT s] [LABELS l...]
#              [PROCESSORS n] [ENVIRONMENT env...])
# One way to register a test: every test has a time limit, so none can hang CI, and says which
# platforms run it.
function(ddp_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;PROCESSORS;PLATFORMS" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  ddp_platform_label(${T_NAME} "${T_PLATFORMS}" platform)
  list(APPEND T_LABELS ${platform})
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if(T_PROCESSORS)
    set_tests_properties(${T_NAME} PROPERTIES PROCESSORS ${T_PROCESSORS})
  endif()
  if(T_ENVIRONMENT)
    set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "${T_ENVIRONMENT}")
  endif()
endfunction()
