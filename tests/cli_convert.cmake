# End-to-end tests of `weld convert`, `weld mkmodel` and `weld info` (tests/scripts/
# cli_convert.sh): usage and error exits, stories260K round trip, and tokenizer parity of
# the converted tokenizer.json under Hugging Face `tokenizers` when node is available.
add_test(NAME cli_convert
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_convert.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_convert_tmp
                 ${CMAKE_CURRENT_SOURCE_DIR}/node)
set_tests_properties(cli_convert PROPERTIES TIMEOUT 120)

# Tokenizer behaviour (ids with BOS as the files say, greedy text, `weld info` add bos) kept
# through HF -> GGUF -> HF and GGUF -> HF -> GGUF for each tokenizer family (issue 26).
add_test(NAME cli_convert_roundtrip
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_convert_roundtrip.sh
                 $<TARGET_FILE:weld> ${CMAKE_CURRENT_BINARY_DIR}/cli_convert_roundtrip_tmp
                 ${CMAKE_CURRENT_SOURCE_DIR}/node)
set_tests_properties(cli_convert_roundtrip PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
