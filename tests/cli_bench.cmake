# Functional check of `weld bench -m MODEL` and `weld bench --bandwidth`
# (tests/scripts/cli_bench.sh) on stories260K: the JSON schema and sane values, the table,
# the dispatch to `weld bench throughput`, bad options. Not a timing test.
add_test(NAME cli_bench
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_bench.sh $<TARGET_FILE:weld>)
set_tests_properties(cli_bench PROPERTIES TIMEOUT 120)
