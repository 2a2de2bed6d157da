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
function(ddp_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM ddp_pch)
  if(DDP_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
                                               UNITY_BUILD_BATCH_SIZE ${DDP_UNITY_BATCH_SIZE})
  endif()
endfunction()

# ddp_add_test(NAME name COMMAND cmd... [TIMEOUT s] [LABELS l...] [PROCESSORS n])
# One way to register a test: every test has a time limit, so none can hang CI.
function(ddp_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;PROCESSORS" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND})
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
  if(T_PROCESSORS)
    set_tests_properties(${T_NAME} PROPERTIES PROCESSORS ${T_PROCESSORS})
  endif()
  if(T_ENVIRONMENT)
    set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "${T_ENVIRONMENT}")
  endif()
endfunction()
