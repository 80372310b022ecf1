# Kernel rules: the gemm test forced onto each instruction set through WELD_ISA (a level
# this CPU lacks must fail with a clear message, which the test checks, so the rule passes
# there too). The kernels' timing tools are built in bench/CMakeLists.txt.
foreach(isa scalar avx2 avx512 amx)
  add_test(NAME test_kernels_gemm_isa_${isa} COMMAND test_kernels_gemm
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_kernels_gemm_isa_${isa} PROPERTIES ENVIRONMENT "WELD_ISA=${isa}")
endforeach()
