# `weld serve` end to end (tests/node/serve_api.mjs, serve_load.mjs, serve_hostile.mjs,
# serve_faults.mjs): a real server on a free loopback port driven by the official `openai`
# npm client, a load test (1,000 requests, 64 concurrent, random client aborts; 300 requests
# under the sanitizers), hostile clients over raw sockets (1,000 idle connections, garbage
# request lines, send timeouts, the reserve for /health, API keys), and faults: SIGTERM in
# the middle of streams, clients that stop reading, the access log. Both need node and
# tests/node/node_modules (npm ci in tests/node); without them the tests are reported skipped
# with the reason. In a WELD_SANITIZE build the server under test is the ASan/UBSan binary.
find_program(WELD_NODE node)
set(weld_serve_model ${WELD_SHARED}/models/stories260K.gguf)
if(WELD_SANITIZE)
  set(weld_load_n 300)
  set(weld_sanitize 1)
else()
  set(weld_load_n 1000)
  set(weld_sanitize 0)
endif()
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${weld_serve_model})
  add_test(NAME server_api
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_api.mjs $<TARGET_FILE:weld>
                   ${weld_serve_model} ${CMAKE_CURRENT_BINARY_DIR}/server_api_tmp
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  add_test(NAME server_load
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_load.mjs $<TARGET_FILE:weld>
                   ${weld_serve_model} ${weld_load_n}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  add_test(NAME server_hostile
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_hostile.mjs $<TARGET_FILE:weld>
                   ${weld_serve_model} ${CMAKE_CURRENT_BINARY_DIR}/server_hostile_tmp
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_hostile PROPERTIES SKIP_RETURN_CODE 77)
  add_test(NAME server_faults
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_faults.mjs $<TARGET_FILE:weld>
                   ${weld_serve_model} ${CMAKE_CURRENT_BINARY_DIR}/server_faults_tmp ${weld_sanitize}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_api server_load server_hostile server_faults PROPERTIES TIMEOUT 240 RUN_SERIAL TRUE)
else()
  foreach(t server_api server_load server_hostile server_faults)
    add_test(NAME ${t} COMMAND sh -c "echo 'skipped: needs node, tests/node/node_modules/openai (npm ci in tests/node) and ${weld_serve_model}'; exit 77")
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
endif()

# speculative decoding through the server: same responses, spec_decode metrics
# (tests/node/serve_spec.mjs)
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${weld_serve_model})
  add_test(NAME server_spec
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_spec.mjs
                   $<TARGET_FILE:weld> ${weld_serve_model}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_spec PROPERTIES TIMEOUT 120)
else()
  add_test(NAME server_spec COMMAND sh -c "echo 'skipped: needs node, tests/node/node_modules/openai (npm ci in tests/node) and ${weld_serve_model}'; exit 77")
  set_tests_properties(server_spec PROPERTIES SKIP_RETURN_CODE 77)
endif()

# /v1/embeddings and echo with prompt logprobs (tests/node/serve_pooling.mjs)
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${weld_serve_model})
  add_test(NAME server_pooling
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_pooling.mjs
                   $<TARGET_FILE:weld> ${weld_serve_model}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_pooling PROPERTIES TIMEOUT 120)
else()
  add_test(NAME server_pooling COMMAND sh -c "echo 'skipped: needs node, tests/node/node_modules/openai (npm ci in tests/node) and ${weld_serve_model}'; exit 77")
  set_tests_properties(server_pooling PROPERTIES SKIP_RETURN_CODE 77)
endif()

# Structured outputs validated by ajv over a corpus of 120 JSON schemas on three random
# models with real vocabularies (tests/node/serve_structured.mjs; the sanitizer build runs
# one vocabulary and 20 schemas), and tool calling through the official client
# (tests/node/serve_tools.mjs).
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/ajv-formats/package.json
   AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json)
  add_test(NAME server_structured
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_structured.mjs
                   $<TARGET_FILE:weld> ${CMAKE_CURRENT_BINARY_DIR}/server_structured_tmp ${weld_sanitize}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  add_test(NAME server_tools
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_tools.mjs
                   $<TARGET_FILE:weld> ${CMAKE_CURRENT_BINARY_DIR}/server_tools_tmp ${weld_sanitize}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_structured PROPERTIES TIMEOUT 600)
  set_tests_properties(server_tools PROPERTIES TIMEOUT 300)
else()
  foreach(t server_structured server_tools)
    add_test(NAME ${t} COMMAND sh -c "echo 'skipped: needs node and tests/node/node_modules (ajv, ajv-formats, openai: npm ci in tests/node)'; exit 77")
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
endif()

# Disaggregated prefill and the KV tier through the server (tests/node/serve_pd.mjs): a
# kv_producer and a kv_consumer sharing a Redis store answer as one plain server; a file
# tier under a small pool answers the same. Needs redis-server (skipped without).
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${weld_serve_model})
  add_test(NAME server_pd
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/serve_pd.mjs
                   $<TARGET_FILE:weld> ${weld_serve_model} ${CMAKE_CURRENT_BINARY_DIR}/server_pd_tmp
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(server_pd PROPERTIES TIMEOUT 180)
else()
  add_test(NAME server_pd COMMAND sh -c "echo 'skipped: needs node, tests/node/node_modules/openai (npm ci in tests/node) and ${weld_serve_model}'; exit 77")
  set_tests_properties(server_pd PROPERTIES SKIP_RETURN_CODE 77)
endif()
