# The everyday CLI (issue 26; tests/scripts/cli_ux.sh): prompts from -f / stdin, -n -1 and
# -n 0, stdout carrying only text, one "weld <cmd>:" prefix and errors that name the flag,
# `weld batch` input checks and exit status, `make run` and README's bench commands on
# stories260K. Skipped (77) without the shared model.
add_test(NAME cli_ux
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_ux.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_ux_tmp ${CMAKE_SOURCE_DIR})
set_tests_properties(cli_ux PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
