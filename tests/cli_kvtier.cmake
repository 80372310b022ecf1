# The KV tier end to end (tests/scripts/cli_kvtier.sh): `weld batch` through a pool too
# small for its prefixes with a file tier and a Redis store, same tokens as without.
add_test(NAME cli_kvtier
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_kvtier.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_kvtier_tmp)
set_tests_properties(cli_kvtier PROPERTIES TIMEOUT 120)
