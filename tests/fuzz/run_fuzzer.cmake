# Runs one libFuzzer target for a fixed time from a fresh copy of its seed corpus (ctest -L fuzz).
# -D FUZZER=<exe> SEEDS=<dir, or a file pattern such as configs/*.yaml> WORK=<dir> SECONDS=<n>
# [DICT=<libFuzzer dictionary>].
# Fails on any crash, leak, timeout or sanitizer report; the reproducer is left in WORK/artifacts/.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus" "${WORK}/artifacts")
if(IS_DIRECTORY "${SEEDS}")
  file(GLOB seeds "${SEEDS}/*")
else()
  file(GLOB seeds "${SEEDS}")
endif()
if(NOT seeds)
  message(FATAL_ERROR "no seeds in ${SEEDS}")
endif()
file(COPY ${seeds} DESTINATION "${WORK}/corpus")
set(dict_arg)
if(DICT)
  set(dict_arg "-dict=${DICT}")
endif()
execute_process(
  COMMAND "${FUZZER}" "${WORK}/corpus" ${dict_arg} -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10
          -max_len=16384 -print_final_stats=1 "-artifact_prefix=${WORK}/artifacts/"
  WORKING_DIRECTORY "${WORK}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer in ${WORK}/artifacts/")
endif()
