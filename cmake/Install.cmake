# `cmake --install` and the Debian package (CPack): the binary, the bundled suites, the docs.
# Suites go to <datadir>/accelbench/suites, which src/system/paths.h looks up beside the binary
# (so an unpacked package works from any folder) and at the absolute path compiled in.
#
# The CUDA build links cuBLASLt, cuDNN and NCCL directly, so a missing one stops the dynamic
# loader before main() with a bare "cannot open shared object file". There the installed
# `accelbench` is a launcher script (cmake/accelbench-launcher.sh) that names every missing
# library and what provides it, then runs the binary from <libexecdir>/accelbench/.
if(ACCELBENCH_CUDA)
  install(TARGETS accelbench RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/accelbench)
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/cmake/accelbench-launcher.sh DESTINATION ${CMAKE_INSTALL_BINDIR}
          RENAME accelbench)
else()
  install(TARGETS accelbench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/suites/ DESTINATION ${CMAKE_INSTALL_DATADIR}/accelbench/suites
        FILES_MATCHING PATTERN "*.yaml")
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME accelbench)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Benchmarks for AI accelerators: GEMM, memory, collectives, training, inference")
set(CPACK_PACKAGE_CONTACT "accelbench maintainers <accelbench@localhost>")
# The package installs where `cmake --install` does (the release preset: /usr), so the suites'
# absolute path compiled into the binary is the one the package fills.
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
if(ACCELBENCH_CUDA)
  # CUDA, cuDNN and NCCL come from NVIDIA's packages or tarballs, which dpkg-shlibdeps cannot
  # resolve: the distribution's libraries are named here, NVIDIA's are the launcher's to check.
  set(CPACK_PACKAGE_NAME accelbench-cuda)
  set(CPACK_DEBIAN_PACKAGE_CONFLICTS accelbench)  # the same files, built without CUDA
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
      "libc6, libstdc++6, libgomp1, libopenblas0 | libopenblas0-pthread, libsqlite3-0, libyaml-cpp0.7 | libyaml-cpp0.8")
  find_package(MPI COMPONENTS CXX QUIET)  # as src/dist does, which links MPI where it is found
  if(MPI_CXX_FOUND)
    string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libopenmpi3 | libopenmpi3t64")
  endif()
else()
  set(CPACK_DEBIAN_PACKAGE_CONFLICTS accelbench-cuda)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
endif()
include(CPack)
