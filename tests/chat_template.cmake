# Chat template parity with Hugging Face: tests/node/chat_template_ref.js renders real chat
# templates with @huggingface/jinja into the build tree (fixture chat_template_ref), then
# test_template_chat renders the same with weld and compares byte for byte.
# Without node the reference step is not registered and the C test reports the missing file.
find_program(WELD_NODE node)
if(WELD_NODE AND TARGET test_template_chat)
  add_test(NAME chat_template_ref_data
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/chat_template_ref.js
                   ${CMAKE_CURRENT_BINARY_DIR}/chat_template_ref.json
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(chat_template_ref_data PROPERTIES FIXTURES_SETUP chat_template_ref
                       TIMEOUT 120)
  set_tests_properties(test_template_chat PROPERTIES
    FIXTURES_REQUIRED chat_template_ref
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
    ENVIRONMENT "WELD_CHAT_TEMPLATE_REF=${CMAKE_CURRENT_BINARY_DIR}/chat_template_ref.json")
endif()
