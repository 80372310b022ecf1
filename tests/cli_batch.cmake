# End-to-end tests of `weld batch` and `weld bench throughput` (tests/scripts/cli_batch.sh):
# golden greedy results through the engine, input order and per-line errors, stop strings,
# n > 1, prefix-cache hits, bench datasets and bad options.
add_test(NAME cli_batch
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_batch.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_batch_tmp)
set_tests_properties(cli_batch PROPERTIES TIMEOUT 120)
