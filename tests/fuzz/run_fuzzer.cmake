# Runs one libFuzzer target for a fixed time from a fresh copy of its seed corpus (ctest -L fuzz).
# -D FUZZER=<exe> SEEDS=<dir> WORK=<dir> SECONDS=<n>. Fails on any crash, leak, timeout or
# sanitizer report; the reproducer is left in WORK/artifacts/.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus" "${WORK}/artifacts")
file(GLOB seeds "${SEEDS}/*")
file(COPY ${seeds} DESTINATION "${WORK}/corpus")
execute_process(
  COMMAND "${FUZZER}" "${WORK}/corpus" -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10
          -max_len=16384 -print_final_stats=1 "-artifact_prefix=${WORK}/artifacts/"
  WORKING_DIRECTORY "${WORK}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer in ${WORK}/artifacts/")
endif()
