execute_process(COMMAND git -C ${SRC_DIR} rev-parse HEAD OUTPUT_VARIABLE GIT_COMMIT
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR GIT_COMMIT STREQUAL "")
  # A copy of the tree without .git (the GPU machine gets one) can name its commit in the environment.
  if(DEFINED ENV{AB_GIT_COMMIT})
    set(GIT_COMMIT "$ENV{AB_GIT_COMMIT}")
  else()
    set(GIT_COMMIT "unknown")
  endif()
endif()
execute_process(COMMAND git -C ${SRC_DIR} status --porcelain --untracked-files=no
                OUTPUT_VARIABLE GIT_STATUS OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(GIT_STATUS STREQUAL "")
  set(GIT_DIRTY "false")
else()
  set(GIT_DIRTY "true")
endif()
configure_file(${IN} ${OUT}.tmp @ONLY)
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
