# The calibration cache seen from the program: `xgrad --version --verbose` with XGRAD_CACHE_DIR
# set to a fresh folder DIR, run twice, then on a broken cache file, then with the cache off.
#   cmake -DPROGRAM=xgrad -DDIR=folder -P calibration_cache.cmake
# On a CPU where the bfloat16 choices are measured (AVX512_BF16) the first run writes the file
# and the second reads it: the same kernel lines, each marked "read from the calibration cache";
# a file that does not parse fails the run with one line naming it. Elsewhere no choice is
# measured and no file is written (the unit tests, [calibration_cache], cover the file on every CPU).
file(REMOVE_RECURSE "${DIR}")
set(cache "${DIR}/calibration-v1.txt")
function(run_verbose out_var rc_var)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "XGRAD_CACHE_DIR=${DIR}" ${PROGRAM} --version --verbose
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} ${rc} PARENT_SCOPE)
endfunction()

run_verbose(first rc)
message("first run:\n${first}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "xgrad --version --verbose failed with ${rc}")
endif()
if(NOT first MATCHES "\ncalibration cache: ${DIR}/calibration-v1.txt\n")
  message(FATAL_ERROR "the first run does not name the cache file ${cache}")
endif()
if(first MATCHES "read from the calibration cache")
  message(FATAL_ERROR "the first run read a cache from a fresh folder")
endif()
string(REGEX MATCHALL "measured at" measured "${first}")
list(LENGTH measured n_measured)
if(n_measured EQUAL 0)
  if(EXISTS "${cache}")
    message(FATAL_ERROR "no choice was measured, yet ${cache} was written")
  endif()
  message("no kernel choice is measured on this CPU: no cache file, as expected")
else()
  if(NOT EXISTS "${cache}")
    message(FATAL_ERROR "${n_measured} choices were measured but ${cache} was not written")
  endif()
  run_verbose(second rc)
  message("second run:\n${second}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the second run failed with ${rc}")
  endif()
  string(REGEX MATCHALL "read from the calibration cache" read "${second}")
  list(LENGTH read n_read)
  if(NOT n_read EQUAL n_measured)
    message(FATAL_ERROR "the second run read ${n_read} of the ${n_measured} measured choices from the cache")
  endif()
  string(REPLACE ", read from the calibration cache" "" second_plain "${second}")
  if(NOT second_plain STREQUAL first)
    message(FATAL_ERROR "the second run chose differently from the first")
  endif()
  # A broken file: one line naming it, a non-zero exit, the file left as it was.
  file(WRITE "${cache}" "xgrad calibration cache 1\nkey\tratio\tfast\n")
  run_verbose(broken rc)
  message("broken cache:\n${broken}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "a broken cache file did not fail the run")
  endif()
  if(NOT broken MATCHES "^xgrad: calibration cache ${DIR}/calibration-v1.txt, line 2: the value 'fast' of ratio is not a positive number up to 1e6 \\(delete the file and xgrad measures again\\)\n$")
    message(FATAL_ERROR "the broken cache's error is not the one line expected")
  endif()
  # ... and `xgrad train --dtype bfloat16` refuses to start on it: the same line alone (out and
  # err together), before the run folder is created.
  set(run "${DIR}/run")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "XGRAD_CACHE_DIR=${DIR}" ${PROGRAM} train --out ${run} --dtype bfloat16
                          --steps 1 --n-digits 4 --batch 4 --d-model 64 --heads 2 --layers 1 --no-progress --no-plot --threads 1
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("train on the broken cache:\n${out}${err}")
  if(NOT rc EQUAL 1 OR NOT "${out}${err}" MATCHES "^xgrad: calibration cache ${DIR}/calibration-v1.txt, line 2: [^\n]*\n$" OR EXISTS "${run}")
    message(FATAL_ERROR "xgrad train on a broken cache: exit ${rc} (want 1 and the one line above, and no ${run})")
  endif()
endif()

# Off: nothing written, every run measures.
file(REMOVE_RECURSE "${DIR}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env XGRAD_CACHE_DIR=off ${PROGRAM} --version --verbose
                RESULT_VARIABLE rc OUTPUT_VARIABLE off ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT off MATCHES "\ncalibration cache: off \\(XGRAD_CACHE_DIR=off or no HOME\\)\n" OR EXISTS "${DIR}"
   OR off MATCHES "read from the calibration cache")
  message(FATAL_ERROR "XGRAD_CACHE_DIR=off: exit ${rc}, output\n${off}${err}")
endif()
message("the cache was written, read back with the same choices, refused when broken, and left alone when off")
