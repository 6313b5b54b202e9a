# Runs PROGRAM with ARGS (a ;-separated list) and passes only if it exits with a non-zero
# status AND its output matches EXPECT: a deliberately broken run must fail, and fail for the
# stated reason. Usage:
#   cmake -DPROGRAM=... -DARGS=--inject-bug -DEXPECT=regex [-DABSENT=path] -P expect_failure.cmake
# With -DABSENT=path (absolute): the path is removed first and must not exist after the run (a
# refused run creates nothing).
if(DEFINED ABSENT)
  file(REMOVE_RECURSE "${ABSENT}")
endif()
execute_process(COMMAND ${PROGRAM} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(DEFINED ABSENT AND EXISTS "${ABSENT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS} failed but created ${ABSENT}")
endif()
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status from ${PROGRAM} ${ARGS}, got 0")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output of ${PROGRAM} ${ARGS} does not match '${EXPECT}'")
endif()
message("exit status ${rc} and output matching '${EXPECT}', as expected")
