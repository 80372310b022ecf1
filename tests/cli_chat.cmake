# End-to-end tests of `weld chat` / `weld generate -i` / --chat-template
# (tests/scripts/cli_chat.sh): cli_chat pipes messages through stdin; cli_chat_tmux drives a
# real terminal with tmux (send-keys, capture-pane): streaming, prefix reuse, Ctrl-C, /clear,
# /exit. Both skip (77) without the shared model; the tmux one also without tmux.
foreach(mode pipe tmux)
  set(t cli_chat_${mode})
  if(mode STREQUAL "pipe")
    set(t cli_chat)
  endif()
  add_test(NAME ${t}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/cli_chat.sh ${mode} $<TARGET_FILE:weld>
                   ${CMAKE_CURRENT_BINARY_DIR}/${t}_tmp)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180)
endforeach()
