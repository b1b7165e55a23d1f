# Compiles through ccache where it is installed (scripts/install-deps.sh installs it): a rebuild
# of an unchanged file, in this build dir or another of the same tree, comes from the cache.
# A launcher given on the command line (-DCMAKE_CXX_COMPILER_LAUNCHER=...) is kept; off with
# -DACCELBENCH_CCACHE=OFF.
option(ACCELBENCH_CCACHE "Compile through ccache where it is installed" ON)
if(ACCELBENCH_CCACHE)
  find_program(AB_CCACHE_PROGRAM ccache)
  if(AB_CCACHE_PROGRAM)
    foreach(lang IN ITEMS CXX CUDA)
      if(NOT CMAKE_${lang}_COMPILER_LAUNCHER)
        set(CMAKE_${lang}_COMPILER_LAUNCHER "${AB_CCACHE_PROGRAM}")
      endif()
    endforeach()
    message(STATUS "ccache: ${AB_CCACHE_PROGRAM}")
  endif()
endif()
