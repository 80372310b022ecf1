# End-to-end tests of the weld command (shell scripts in tests/scripts/).
add_test(NAME cli_generate
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_generate.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_generate_tmp)
