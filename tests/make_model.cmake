# `make model` (scripts/fetch-model.sh; tests/scripts/make_model.sh): present files kept,
# downloads checked by sha256, failures leave nothing and say what to do. Offline: file://
# URLs stand in for Hugging Face.
add_test(NAME make_model
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/make_model.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/make_model_tmp)
set_tests_properties(make_model PROPERTIES TIMEOUT 60)
