# Tokenizer parity with Hugging Face: a node script (tests/node/tokenizer_ref.js) writes the
# reference ids and decodes for the corpus into the build tree (fixture), then
# test_tokenizer_parity compares weld against them. Without node the fixture is not
# registered and the C test fails, saying the reference file is missing and how to make it.
find_program(WELD_NODE node)
if(WELD_NODE AND TARGET test_tokenizer_parity)
  add_test(NAME tokenizer_ref_data
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/tokenizer_ref.js
                   ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_ref
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(tokenizer_ref_data PROPERTIES FIXTURES_SETUP tokenizer_ref TIMEOUT 300)
  set_tests_properties(test_tokenizer_parity PROPERTIES FIXTURES_REQUIRED tokenizer_ref
    ENVIRONMENT "WELD_NODE_DIR=${CMAKE_CURRENT_SOURCE_DIR}/node;WELD_TOKENIZER_REF=${CMAKE_CURRENT_BINARY_DIR}/tokenizer_ref/tokenizer_ref.json")
endif()

# `weld tokenize` end to end: stories260K ids as llama.cpp's llama-tokenize prints them.
set(weld_tok_model ${WELD_SHARED}/models/stories260K.gguf)
if(EXISTS ${weld_tok_model})
  add_test(NAME cli_tokenize_stories260k
           COMMAND weld tokenize -m ${weld_tok_model} "Once upon a time")
  set_tests_properties(cli_tokenize_stories260k PROPERTIES
                       PASS_REGULAR_EXPRESSION "^1 403 407 261 378\n$")
  add_test(NAME cli_tokenize_pieces
           COMMAND weld tokenize -m ${weld_tok_model} --no-special --show-pieces "Once upon")
  set_tests_properties(cli_tokenize_pieces PROPERTIES
                       PASS_REGULAR_EXPRESSION "^403\tOnce\n407\t upon\n$")
else()
  foreach(t cli_tokenize_stories260k cli_tokenize_pieces)
    add_test(NAME ${t} COMMAND sh -c "echo 'skipped: needs ${weld_tok_model}'; exit 77")
  endforeach()
endif()
add_test(NAME cli_tokenize_usage COMMAND weld tokenize "text without a model")
set_tests_properties(cli_tokenize_usage PROPERTIES WILL_FAIL TRUE)
