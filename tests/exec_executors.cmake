# Executor rules: the forward-pass tests that use the default executor (ops on a machine
# with more than one physical core, ref on one) run again with each executor forced
# through --exec NAME (tests/test.h test_args), so both are covered whatever the machine. test_exec_executors itself
# compares them directly.
foreach(ex ref ops)
  foreach(t test_exec_paged test_exec_golden test_engine_engine)
    add_test(NAME ${t}_${ex} COMMAND ${t} --exec ${ex}
             WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  endforeach()
endforeach()
