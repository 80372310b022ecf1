# Kernel rules: the gemm test forced onto each instruction set through WELD_ISA (on a CPU
# that lacks the level the test checks that weld refuses it, naming what is missing, and
# reports Skipped: those kernels are not tested on that machine), and the timing tools weld_kernel_bench (bench/kernels_bench.c) and
# weld_attn_bench (bench/attn_bench.c); not tests.
foreach(isa scalar avx2 avx512 amx)
  add_test(NAME test_kernels_gemm_isa_${isa} COMMAND test_kernels_gemm
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_kernels_gemm_isa_${isa} PROPERTIES ENVIRONMENT "WELD_ISA=${isa}")
endforeach()

add_executable(weld_kernel_bench ${CMAKE_SOURCE_DIR}/bench/kernels_bench.c)
target_link_libraries(weld_kernel_bench PRIVATE weld_kernels)

add_executable(weld_attn_bench ${CMAKE_SOURCE_DIR}/bench/attn_bench.c)
target_link_libraries(weld_attn_bench PRIVATE weld_kernels)
