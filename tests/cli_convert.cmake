# End-to-end tests of `weld convert`, `weld mkmodel` and `weld info` (tests/scripts/
# cli_convert.sh): usage and error exits, stories260K round trip, and tokenizer parity of
# the converted tokenizer.json under Hugging Face `tokenizers` when node is available.
set(WELD_SHARED_DIR "${CMAKE_SOURCE_DIR}/../shared" CACHE PATH "shared/ with models/")
add_test(NAME cli_convert
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_convert.sh $<TARGET_FILE:weld>
                 ${WELD_SHARED_DIR} ${CMAKE_CURRENT_BINARY_DIR}/cli_convert_tmp
                 ${CMAKE_CURRENT_SOURCE_DIR}/node)
set_tests_properties(cli_convert PROPERTIES TIMEOUT 120)
