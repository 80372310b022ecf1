# test_exec_llamacpp_oracle: weld against llama.cpp outputs recorded in
# tests/data/llamacpp_oracle (scripts/record-llamacpp-oracle.sh); it rewrites each model
# with the weld binary, so it needs weld built, and reports skipped (77) without the
# tokenizers of tests/node/node_modules.
if(TARGET test_exec_llamacpp_oracle)
  add_dependencies(test_exec_llamacpp_oracle weld)
  set_tests_properties(test_exec_llamacpp_oracle PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
