# Megakernel rules: the forward-pass tests that use the default executor run again with
# --exec mega forced (the default only when the machine has more than one physical
# core), and the CLI's greedy golden output of stories260K must be unchanged under mega
# (default threads: one per physical core). exec_executors.cmake does the same for ref
# and ops; test_exec_executors and test_exec_mega compare the executors directly.
#
# TSan is a separate build (not a ctest rule: it needs its own compiler flags):
#   cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DWELD_TSAN=ON
#   cmake --build build-tsan --target test_exec_executors test_exec_mega test_core_team
#   (cd build-tsan && ./tests/test_exec_mega && ./tests/test_exec_executors)
foreach(t test_exec_paged test_exec_golden test_engine_engine)
  add_test(NAME ${t}_mega COMMAND ${t} --exec mega WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endforeach()
add_test(NAME cli_generate_mega
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_generate.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_generate_mega_tmp --exec mega)
