# weld bench serve tests: test_loadgen_unit (no network), test_loadgen_http (an in-process
# libmicrohttpd server streaming canned completions) and test_loadgen_serve (weld bench
# serve against weld serve on stories260K; it starts a server process, so it gets a
# timeout of its own and runs alone).
set_tests_properties(test_loadgen_http PROPERTIES TIMEOUT 120)
set_tests_properties(test_loadgen_serve PROPERTIES TIMEOUT 180 RUN_SERIAL TRUE)
