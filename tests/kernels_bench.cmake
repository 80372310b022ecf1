# Kernel rules: the gemm test forced onto each instruction set through WELD_ISA (on a CPU
# that lacks the level the test checks that weld refuses it, naming what is missing, and
# reports Skipped: those kernels are not tested on that machine). The kernels' timing tools
# are built in bench/CMakeLists.txt.
foreach(isa scalar avx2 avx512 amx)
  add_test(NAME test_kernels_gemm_isa_${isa} COMMAND test_kernels_gemm
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_kernels_gemm_isa_${isa} PROPERTIES ENVIRONMENT "WELD_ISA=${isa}")
endforeach()
