# `cmake --install BUILD --prefix P` puts the library, its headers, the apps and a CMake package into P,
# so an outside project does
#   find_package(ringtrain CONFIG REQUIRED)   # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE ringtrain::ringtrain)
# The floors are static libraries (ringtrain::ringtrain_core, _io, _optim ... ringtrain::ringtrain_runtime; the interface
# target ringtrain::ringtrain links them all): their private dependencies (OpenBLAS, oneDNN, OpenMP, zlib,
# libjpeg, libpng and, in a CUDA build, cuDNN, cuBLAS, NCCL) are link-only requirements that
# ringtrainConfig.cmake finds again; MPI (comm/ headers include mpi.h), HDF5, nlohmann-json and CLI11 (the
# runtime's headers use them) are public and propagate to the user's target.
include(CMakePackageConfigHelpers)

install(TARGETS ringtrain ringtrain_core ringtrain_io ringtrain_optim ringtrain_data ringtrain_layers ringtrain_comm
                ringtrain_runtime ${RINGTRAIN_RUNTIME_AREAS}
        EXPORT ringtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# Public headers keep their folders (include/ringtrain/core/tensor.h, ...); the CPU and CUDA kernel
# headers under core/cpu and core/cuda are internal.
foreach(dir core io optim layers layers/models comm data runtime runtime/cluster runtime/config runtime/telemetry
            runtime/checkpoint runtime/step runtime/memory runtime/pipeline runtime/layout runtime/loop runtime/tools)
  file(GLOB _rt_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  install(FILES ${_rt_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringtrain/${dir})
endforeach()
install(TARGETS train_resnet ringtrain_plan ringtrain_env allreduce_bench make_shards bench_step bench_loader
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(_rt_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ringtrain)
install(EXPORT ringtrainTargets NAMESPACE ringtrain:: DESTINATION ${_rt_config_dir})
set(RINGTRAIN_INSTALL_CUDNN_LIBRARY "${RINGTRAIN_CUDNN_LIBRARY}")
set(RINGTRAIN_INSTALL_NCCL_LIBRARY "${RINGTRAIN_NCCL_LIBRARY}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ringtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ringtrainConfig.cmake INSTALL_DESTINATION ${_rt_config_dir})
# 0.x releases are compatible only within the same minor version.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringtrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringtrainConfig.cmake ${PROJECT_BINARY_DIR}/ringtrainConfigVersion.cmake
        DESTINATION ${_rt_config_dir})
