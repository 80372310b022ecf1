#!/usr/bin/env bash
# The everyday CLI of issue 26 on stories260K (128-token context), run as a user would:
#   prompts   -f FILE, -p -, a pipe; -n -1 (until the end or a full context), -n 0 (the
#             prompt alone, its statistics); conflicting or missing prompt sources
#   output    stdout is the text and ends with a newline; notices and the speed line are
#             lines of their own even when stdout and stderr are one file; no seed or echo
#             before an error
#   errors    one "weld <cmd>:" prefix; --ctx named for generate -c; mkmodel without a
#             tokenizer; convert --dtype lists the valid types; serve on a missing model
#             exits 1 without "listening"
#   batch     the input checked before the model loads; exit 1 when a line failed; the
#             summary's counts
#   make run  and every `weld bench` command of README.md work on the shared model; bench
#             beyond the context is an error; the bandwidth share of a cache-resident model
#             is labelled
# usage: WELD_SHARED=DIR cli_ux.sh WELD_BIN SCRATCH_DIR SOURCE_DIR   (exit 77: skipped)
set -u
weld=$1 tmp=$2 src=$3
. "$(dirname "$0")/lib.sh"
# every "weld ...:" message starts its own line
expect_own_lines() {
  local glued
  glued=$(grep -n '.weld\( [a-z]*\)*:' "$1" | grep -v '^[0-9]*:weld\( [a-z]*\)*:' | head -3)
  [ -z "$glued" ] && ok || bad "$2: a message glued to other text: [$glued]"
}
# README.md's command lines, continuation lines joined
readme_cmds() { sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$src/README.md"; }
require_stories
rm -rf "$tmp"
mkdir -p "$tmp"
golden="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
greedy=(-m "$model" -n 32 --temp 0)

# ---- prompts from a file, stdin, a pipe ----------------------------------------------------
printf 'Once upon a time\n' > "$tmp/prompt.txt"
out=$("$weld" generate "${greedy[@]}" -f "$tmp/prompt.txt" 2>/dev/null)
expect_eq "$out" "$golden" "-f FILE (trailing newline dropped)"
out=$("$weld" generate "${greedy[@]}" -p - < "$tmp/prompt.txt" 2>/dev/null)
expect_eq "$out" "$golden" "-p - reads stdin"
out=$(echo "Once upon a time" | "$weld" generate "${greedy[@]}" 2>/dev/null)
expect_eq "$out" "$golden" "a pipe without -p"
err=$("$weld" generate "${greedy[@]}" -p hi -f "$tmp/prompt.txt" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" "2" "-p and -f together: usage error"
expect_contains "$err" "not both" "-p and -f together: message"
err=$("$weld" generate "${greedy[@]}" -f "$tmp/none.txt" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" "1" "-f missing file: exit"
expect_contains "$err" "-f $tmp/none.txt: cannot open" "-f missing file named"
printf 'a\0b' > "$tmp/nul.txt"
err=$("$weld" generate "${greedy[@]}" -f "$tmp/nul.txt" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" "1" "-f file with a NUL byte: exit"

# ---- -n -1, -n 0 ---------------------------------------------------------------------------
"$weld" generate -m "$model" -p "Once upon a time" -n -1 --temp 0 >"$tmp/n1.out" 2>"$tmp/n1.err"
expect_eq "$?" "0" "-n -1 exit"
expect_contains "$(cat "$tmp/n1.err")" "generated 123 tokens" "-n -1 fills the 128-token context"
expect_contains "$(cat "$tmp/n1.err")" "the context is full" "-n -1: a notice says why it stopped"
expect_lacks "$(cat "$tmp/n1.err")" "warning" "-n -1: a full context is no warning"
expect_eq "$(tail -c 1 "$tmp/n1.out" | od -An -c | tr -d ' ')" '\n' "stdout ends with a newline"
expect_contains "$(cat "$tmp/n1.out")" "$golden" "-n -1 greedy text"
"$weld" generate -m "$model" -p "Once upon a time" -n 0 >"$tmp/n0.out" 2>"$tmp/n0.err"
expect_eq "$?" "0" "-n 0 exit"
expect_eq "$(cat "$tmp/n0.out")" "Once upon a time" "-n 0: stdout is the prompt alone"
expect_contains "$(cat "$tmp/n0.err")" "prompt 5 tokens in" "-n 0: prompt statistics"
expect_lacks "$(cat "$tmp/n0.err")" "generated" "-n 0: nothing generated"
out=$("$weld" generate -m "$model" -p "Once upon a time" -n 0 --no-echo 2>/dev/null)
expect_eq "$out" "" "-n 0 --no-echo: empty stdout"
"$weld" generate -m "$model" -p hi -n -2 >/dev/null 2>&1; expect_eq "$?" "2" "-n -2: usage error"

# ---- output discipline: stdout and stderr in one file --------------------------------------
"$weld" generate -m "$model" -p "Once upon a time" -n 256 --seed 1 >"$tmp/both.txt" 2>&1
expect_eq "$?" "0" "-n 256 beyond the context: exit"
expect_own_lines "$tmp/both.txt" "-n 256 into one file"
expect_contains "$(grep '^weld generate: warning:' "$tmp/both.txt")" "the context is full" \
  "-n 256: the context notice is a line of its own"
err=$("$weld" generate -m "$model" < /dev/null 2>&1); rc=$?
expect_eq "$rc" "1" "empty standard input: exit"
expect_contains "$err" "standard input is empty" "empty standard input: says so"
if command -v script >/dev/null; then # on a terminal: stdout and stderr are one device
  out=$(script -qec "'$weld' generate -m '$model' -n 5" /dev/null < /dev/null 2>&1)
  expect_contains "$out" "no prompt: give -p TEXT, -f FILE" "no prompt on a terminal"
  script -qec "'$weld' generate -m '$model' -p 'Once upon a time' -n 256 --seed 2" /dev/null \
    < /dev/null 2>&1 | tr -d '\r' > "$tmp/tty.txt"
  expect_own_lines "$tmp/tty.txt" "-n 256 on a terminal"
  expect_contains "$(cat "$tmp/tty.txt")" "generated 123 tokens" "-n 256 on a terminal ran"
fi
# errors come alone: no seed, no echoed prompt
for args in "-m $tmp/none.gguf -p hi" "-m $model -c 5000 -p hi" "-m $model -p -"; do
  out=$(yes 'hello there' | head -300 | tr '\n' ' ' | "$weld" generate $args 2>"$tmp/e.err"); rc=$?
  expect_eq "$rc" "1" "generate $args: exit"
  expect_eq "$out" "" "generate $args: nothing on stdout"
  expect_lacks "$(cat "$tmp/e.err")" "seed" "generate $args: no seed before the error"
  expect_eq "$(wc -l < "$tmp/e.err")" "1" "generate $args: one error line"
done
err=$("$weld" generate -m "$model" -c 5000 -p hi 2>&1)
expect_contains "$err" "--ctx 5000" "generate -c names --ctx"
expect_lacks "$err" "max-model-len" "generate -c does not speak of --max-model-len"
err=$(yes 'hello there' | head -300 | tr '\n' ' ' | "$weld" generate -m "$model" -p - 2>&1)
expect_contains "$err" "longer than the model's context of 128" "prompt too long: names the context"
err=$("$weld" generate -m "$model" -p hi -n abc 2>&1)
expect_contains "$err" "weld generate: bad value 'abc' for -n" "bad value names what was typed"
err=$("$weld" generate -m "$model" -p hi --top-p 3 2>&1)
expect_contains "$err" "--top-p 3" "sampler errors name the flag"

# ---- error prefixes and messages -----------------------------------------------------------
err=$("$weld" mkmodel --preset tiny --out "$tmp/mk.gguf" 2>&1); rc=$?
expect_eq "$rc" "2" "mkmodel without a tokenizer: usage error"
expect_contains "$err" "--tokenizer" "mkmodel without a tokenizer names the flag"
expect_lacks "$err" "vocab size = 0" "mkmodel without a tokenizer: no 'vocab size = 0'"
expect_lacks "$err" "mkmodel: mkmodel" "mkmodel: one prefix"
err=$("$weld" convert "$model" "$tmp/x.gguf" --dtype q9 2>&1); rc=$?
expect_eq "$rc" "2" "convert bad dtype: usage error"
expect_contains "$err" "f32, f16, bf16, q4_0" "convert bad dtype lists the valid ones"
expect_contains "$err" "q8_0" "convert bad dtype lists q8_0"
err=$("$weld" bench throughput --nope 2>&1)
expect_contains "$err" "weld bench throughput: unknown option '--nope'" "bench throughput prefix"
err=$("$weld" bench serve --base-url http://127.0.0.1:1 -n 1 2>&1); rc=$?
expect_eq "$rc" "1" "bench serve without a server: exit"
expect_contains "$err" "is a server running at --base-url http://127.0.0.1:1?" \
  "bench serve without a server: says what to do"
err=$(timeout 60 "$weld" serve "$tmp/none.gguf" --port 0 2>&1); rc=$?
expect_eq "$rc" "1" "serve on a missing model: exit 1"
expect_lacks "$err" "listening" "serve on a missing model: no 'listening'"
expect_contains "$err" "none.gguf" "serve on a missing model: names it"
# a served model: one prefix on every line, SIGTERM included
"$weld" serve "$model" --port 0 >/dev/null 2>"$tmp/serve.err" &
spid=$!
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/serve.err")
  [ -n "$port" ] && break
  kill -0 $spid 2>/dev/null || break
  sleep 0.1
done
if [ -n "$port" ]; then
  ok
  # the README's load-generator command, as written but for the port and a shorter run
  cmd=$(readme_cmds | grep '^build/weld bench serve' | head -1)
  cmd=${cmd//MODEL/$model}
  cmd=${cmd/build\/weld/$weld}
  cmd=${cmd/http:\/\/127.0.0.1:8000/http://127.0.0.1:$port}
  cmd=${cmd/--num-prompts 128/--num-prompts 16}
  out=$(eval "$cmd" 2>&1); rc=$?
  expect_eq "$rc" "0" "README bench serve command [$cmd]: $out"
  expect_lacks "$out" "failed" "README bench serve: every request succeeds"
else
  bad "weld serve never said listening: $(cat "$tmp/serve.err")"
fi
kill -TERM $spid 2>/dev/null
wait $spid
expect_lacks "$(cat "$tmp/serve.err")" "weld: weld" "serve: no double prefix"
expect_contains "$(cat "$tmp/serve.err")" "weld serve: SIGTERM: draining" "serve: SIGTERM line"

# ---- batch ---------------------------------------------------------------------------------
# a file that cannot run fails before the model loads (no "kv cache" line of the engine)
: > "$tmp/empty.jsonl"
printf 'hello\nworld\n' > "$tmp/text.jsonl"
for f in "$tmp/none.jsonl" "$tmp/empty.jsonl" "$tmp/text.jsonl"; do
  err=$("$weld" batch -m "$model" --input "$f" 2>&1 >/dev/null); rc=$?
  expect_eq "$rc" "1" "batch --input $f: exit"
  expect_lacks "$err" "kv cache" "batch --input $f: fails before the model loads"
  expect_contains "$err" "$f" "batch --input $f: names the file"
done
err=$("$weld" batch -m "$tmp/none.gguf" --input "$tmp/text.jsonl" 2>&1)
expect_contains "$err" "text.jsonl" "batch: the input is checked before the model"
cat > "$tmp/mixed.jsonl" <<'EOF'
{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
not json

{"prompt": "Once upon a time", "max_tokens": 0}
{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "n": 2}
EOF
"$weld" batch -m "$model" --input "$tmp/mixed.jsonl" --output "$tmp/mixed.out" 2>"$tmp/mixed.err"
expect_eq "$?" "1" "batch with failed lines: exit 1"
expect_eq "$(wc -l < "$tmp/mixed.out")" "4" "batch: a result for every line"
expect_eq "$(grep -c '"error"' "$tmp/mixed.out")" "2" "batch: the failed lines carry their error"
expect_contains "$(cat "$tmp/mixed.err")" "4 lines: 2 succeeded, 2 failed" "batch summary counts lines"
expect_contains "$(cat "$tmp/mixed.err")" "2 requests run (2 finished, 0 failed, 0 aborted), 0 refused" \
  "batch summary counts requests"
head -1 "$tmp/mixed.jsonl" > "$tmp/good.jsonl"
"$weld" batch -m "$model" --input "$tmp/good.jsonl" >/dev/null 2>"$tmp/good.err"
expect_eq "$?" "0" "batch with every line good: exit 0"
expect_contains "$(cat "$tmp/good.err")" "1 lines: 1 succeeded, 0 failed" "batch summary, all good"

# ---- make run, bench -----------------------------------------------------------------------
run=$(make -s -n -C "$src" run MODEL="$model" 2>/dev/null | grep 'build/weld generate')
run=${run/.\/build\/weld/$weld}
if [ -n "$run" ]; then
  eval "$run" >"$tmp/run.txt" 2>&1
  expect_eq "$?" "0" "make run [$run]: exit"
  expect_own_lines "$tmp/run.txt" "make run"
  expect_lacks "$(cat "$tmp/run.txt")" "warning" "make run: no warning"
else
  bad "make -n run shows no weld generate command"
fi
err=$("$weld" bench -m "$model" -p 512 -r 1 --probe-size 16M 2>&1); rc=$?
expect_eq "$rc" "1" "bench -p beyond the context: exit"
expect_contains "$err" "beyond the model's context of 128 tokens" "bench -p beyond the context: says so"
out=$("$weld" bench -m "$model" -r 1 -t 1 --probe-size 16M --json 2>"$tmp/bench.err"); rc=$?
expect_eq "$rc" "0" "bench with default sizes on a short context"
expect_contains "$(cat "$tmp/bench.err")" "running -p 128 -n 127" "bench defaults shrink to the context"
msg=$(node -e '
const j = JSON.parse(process.argv[1]), b = j.bandwidth;
const ok = j.pp.tokens === 128 && j.tg.tokens === 127 && Number.isInteger(b.llc_bytes) &&
           typeof b.cache_resident === "boolean" && (b.cache_resident || b.llc_bytes === 0);
console.log(ok ? "ok" : "bad")' "$out" 2>&1)
expect_eq "$msg" "ok" "bench --json: sizes and cache_resident of a 1 MB model [$out]"
out=$("$weld" bench -m "$model" -r 1 -t 1 -p 16 -n 8 --probe-size 16M 2>&1)
if printf '%s' "$out" | grep -q 'cache-resident'; then ok; else
  case "$out" in *"above 100%"*|*"% of the probe"*) ok ;; *) bad "bench table: [$out]" ;; esac
fi
# the README's `weld bench` commands as written (quicker: -r 1 and a small probe, or 16
# prompts, appended)
while IFS= read -r cmd; do
  case "$cmd" in *--handoff*) continue ;; esac # needs two physical cores
  cmd=${cmd%%#*}
  cmd=${cmd//MODEL/$model}
  cmd=${cmd/build\/weld/$weld}
  case "$cmd" in *throughput*) cmd="$cmd --num-prompts 16" ;; *) cmd="$cmd -r 1 --probe-size 16M" ;; esac
  case "$cmd" in *--pair*) cmd=${cmd/ --probe-size 16M/} ;; esac
  out=$(eval "$cmd" 2>&1); rc=$?
  expect_eq "$rc" "0" "README [$cmd]: $out"
done < <(readme_cmds | grep '^build/weld bench ' | grep -v '^build/weld bench serve')
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
