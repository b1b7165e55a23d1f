# Git commit and build flags are written into every record's context block. They are
# re-read at every build (not only at configure) so a record never names a stale commit.
set(AB_BUILD_INFO_IN ${CMAKE_CURRENT_LIST_DIR}/build_info.cpp.in)
set(AB_BUILD_INFO_OUT ${CMAKE_BINARY_DIR}/generated/build_info.cpp)
string(TOUPPER "${CMAKE_BUILD_TYPE}" _ab_bt)
set(AB_CXX_FLAGS "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_ab_bt}}")
add_custom_target(ab_build_info ALL
  COMMAND ${CMAKE_COMMAND}
          -DSRC_DIR=${CMAKE_SOURCE_DIR} -DIN=${AB_BUILD_INFO_IN} -DOUT=${AB_BUILD_INFO_OUT}
          -DBUILD_TYPE=${CMAKE_BUILD_TYPE} -DCXX_FLAGS=${AB_CXX_FLAGS}
          -DCXX_ID=${CMAKE_CXX_COMPILER_ID}-${CMAKE_CXX_COMPILER_VERSION}
          -DWITH_CUDA=${ACCELBENCH_CUDA} -DCUDA_ARCHS=${CMAKE_CUDA_ARCHITECTURES}
          -DSANITIZE=${ACCELBENCH_SANITIZE} -DVERSION=${PROJECT_VERSION}
          -P ${CMAKE_CURRENT_LIST_DIR}/WriteBuildInfo.cmake
  BYPRODUCTS ${AB_BUILD_INFO_OUT}
  COMMENT "Recording git commit and build flags")
