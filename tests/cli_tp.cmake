# Tensor parallelism over MPI (tests/scripts/cli_tp.sh): mpirun -np N weld ... -tp N against
# one process with --k-parts N, refusals, a rank hung or killed. Under ASan the MPI
# libraries' own allocations are not weld's leaks (tests/data/lsan-mpi.supp).
add_test(NAME cli_tp
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_tp.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_tp_tmp)
set_tests_properties(cli_tp PROPERTIES TIMEOUT 300
  ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/data/lsan-mpi.supp;OMPI_MCA_mca_base_component_disable_dlclose=1;ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0")
# The same over TCP: two ranks in two network namespaces joined by a veth pair.
add_test(NAME cli_tp_netns
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_tp_netns.sh $<TARGET_FILE:weld>
                 ${CMAKE_CURRENT_BINARY_DIR}/cli_tp_netns_tmp)
set_tests_properties(cli_tp_netns PROPERTIES TIMEOUT 200
  ENVIRONMENT "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/data/lsan-mpi.supp;OMPI_MCA_mca_base_component_disable_dlclose=1;ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0")
