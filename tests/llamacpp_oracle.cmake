# test_exec_llamacpp_oracle: weld against llama.cpp outputs recorded in
# tests/data/llamacpp_oracle (scripts/record-llamacpp-oracle.sh); it rewrites each model
# with the weld binary, so it needs weld built, and reports skipped (77) without the
# tokenizers of tests/node/node_modules.
if(TARGET test_exec_llamacpp_oracle)
  add_dependencies(test_exec_llamacpp_oracle weld)
  set_tests_properties(test_exec_llamacpp_oracle PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
  if(WELD_SANITIZE)
    # the memory checks need only a few cases: an SPM, a BPE, a K-quant one, quantized
    # experts and latent attention
    set_property(TEST test_exec_llamacpp_oracle APPEND PROPERTY ENVIRONMENT
                 "WELD_ORACLE_CASES=llama2_f32,qwen3_f32,llama_q4_K,qwen3moe_q8_0,deepseek3_f32")
  endif()
endif()
