# `weld router` end to end (tests/node/router.mjs): three `weld serve` workers on
# stories260K and one on a tiny long-context model made by `weld mkmodel`, behind routers of
# each policy, driven by the official `openai` npm client; fake workers (node HTTP servers)
# for least_load's scraped load and P/D mode. Needs node and tests/node/node_modules (npm ci
# in tests/node); without them it is reported skipped with the reason. In a WELD_SANITIZE
# build the router and the workers are the ASan/UBSan binary. The C unit test of the radix
# tree and the policies is test_router_tree (tests/CMakeLists.txt registers it).
find_program(WELD_NODE node)
set(weld_router_model ${WELD_SHARED}/models/stories260K.gguf)
if(WELD_SANITIZE)
  set(weld_router_sanitize 1)
else()
  set(weld_router_sanitize 0)
endif()
if(WELD_NODE AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/node/node_modules/openai/package.json
   AND EXISTS ${weld_router_model})
  add_test(NAME router_api
           COMMAND ${WELD_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/node/router.mjs $<TARGET_FILE:weld>
                   ${weld_router_model} ${CMAKE_CURRENT_BINARY_DIR}/router_api_tmp
                   ${weld_router_sanitize}
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/node)
  set_tests_properties(router_api PROPERTIES TIMEOUT 240 RUN_SERIAL TRUE)
else()
  add_test(NAME router_api COMMAND sh -c "echo 'skipped: needs node, tests/node/node_modules/openai (npm ci in tests/node) and ${weld_router_model}'; exit 77")
  set_tests_properties(router_api PROPERTIES SKIP_RETURN_CODE 77)
endif()
