# Honest limits of the CLI (tests/scripts/cli_validate.sh): rate-limited preemption logs,
# the tokenizer's regex match limit, info on a tokenizer.json with a custom pre-tokenizer,
# OpenAI ranges on `weld batch` lines.
add_test(NAME cli_validate
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_validate.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_validate_tmp)
set_tests_properties(cli_validate PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
