# `weld CMD org/name`: models in a local Hugging Face hub cache (tests/scripts/cli_model_ref.sh).
add_test(NAME cli_model_ref
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_model_ref.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_model_ref_tmp ${CMAKE_CURRENT_SOURCE_DIR}/node)
set_tests_properties(cli_model_ref PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
