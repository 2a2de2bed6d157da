# `cmake --install build [--prefix P]`: the headers, the static libraries of the layers, the
# programs, the configs, and the CMake package `ddp`, so that a user's project does
#
#   find_package(ddp REQUIRED)                      # CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE ddp::ddp)
#
# Layout under P: include/ddp/, lib/libddp_*.a, lib/cmake/ddp/, bin/{ddp_train,launcher},
# share/ddp/configs/. Included from the top CMakeLists.txt after src/ and launch/, whose targets
# it installs. examples/custom_model is the user's project; tests/scripts/install_example_test.sh
# installs, builds it and runs it on 2 ranks.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DDP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/ddp")

# The one target users link: every layer (ddp::train, ddp::core, ... stay exported too).
add_library(ddp_all INTERFACE)
add_library(ddp::ddp ALIAS ddp_all)
set_target_properties(ddp_all PROPERTIES EXPORT_NAME ddp)
target_link_libraries(ddp_all INTERFACE ddp::train ddp::core ddp::comm ddp::data ddp::models
                                        ddp::nn ddp::launch_info ddp::store ddp::flight_records
                                        ddp::elastic_keys ddp::stacks ddp::shm ddp::common)

# ddp::torch (cmake/DdpDependencies.cmake) holds the paths of the LibTorch found here. The
# package exports it as an empty placeholder instead, and ddpConfig.cmake fills it from the
# user's own find_package(Torch): the package carries no LibTorch path, and the user's program
# links the one LibTorch its other code uses. Each value is kept for this build only.
foreach(property INTERFACE_LINK_LIBRARIES INTERFACE_INCLUDE_DIRECTORIES
                 INTERFACE_SYSTEM_INCLUDE_DIRECTORIES)
  get_target_property(values ddp_torch ${property})
  if(values)
    set_target_properties(ddp_torch PROPERTIES ${property} "$<BUILD_INTERFACE:${values}>")
  endif()
endforeach()
set_target_properties(ddp_torch PROPERTIES EXPORT_NAME torch)

# The libraries, with their include dirs (include/, from ddp_add_layer's INSTALL_INTERFACE) and
# their dependencies as targets. The precompiled header is not part of any of them: the layers
# only reuse it (PRECOMPILE_HEADERS_REUSE_FROM, a build-time property), and ddp_pch is private.
set(ddp_layers ddp_common_lib ddp_stacks_lib ddp_launch_info_lib ddp_store_lib
               ddp_flight_records_lib ddp_elastic_keys_lib ddp_shm_lib ddp_comm_lib ddp_core_lib
               ddp_data_lib ddp_nn_lib ddp_models_lib ddp_train_lib)
# The public headers are C++17 (nested namespaces, inline variables): a requirement of their
# users, not only of this build (which sets CMAKE_CXX_STANDARD).
foreach(layer IN LISTS ddp_layers)
  target_compile_features(${layer} PUBLIC cxx_std_17)
endforeach()
install(TARGETS ${ddp_layers} ddp_all ddp_torch
        EXPORT ddpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${DDP_INSTALL_CMAKEDIR})

# Public headers only (private ones live beside their .cpp in src/), and the generated version.h.
# To include/ as such, not CMAKE_INSTALL_INCLUDEDIR: ddp_add_layer's INSTALL_INTERFACE says
# `include`.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ddp DESTINATION include
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/ddp/version.h DESTINATION include/ddp)

# The programs. LibTorch from a PyTorch wheel lives outside the linker's default paths: keep
# the directories of the libraries they link in their installed RPATH (empty for Debian's).
install(TARGETS ddp_train launcher RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set_target_properties(ddp_train launcher PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ddp/configs)

# The package config: which dependencies the static libraries need depends on what this build
# compiled in (MPI, NCCL), so the config is generated with those answers.
get_property(DDP_HAVE_NCCL GLOBAL PROPERTY DDP_HAVE_NCCL)  # set in src/ (cmake/DdpNccl.cmake)
set(DDP_CONFIG_HAVE_MPI OFF)
if(DDP_HAVE_MPI)
  set(DDP_CONFIG_HAVE_MPI ON)
endif()
set(DDP_CONFIG_NCCL_LIBRARY "")
if(DDP_HAVE_NCCL)
  set(DDP_CONFIG_NCCL_LIBRARY "${DDP_NCCL_LIBRARY}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ddpConfig.cmake
                              INSTALL_DESTINATION ${DDP_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
        DESTINATION ${DDP_INSTALL_CMAKEDIR})
