#!/usr/bin/env bash
# End-to-end checks of `weld generate` on the real stories260K model: the golden greedy
# continuation from the GGUF file and from the Hugging Face directory `weld convert` makes
# of it, echo/--no-echo, seeded sampling reproducibility, backend selection, and clear
# errors (non-zero exit, message naming the problem) for bad input.
# usage: WELD_SHARED=DIR cli_generate.sh WELD_BIN SCRATCH_DIR [GENERATE_FLAGS...]
# (exit 77: skipped; e.g. --exec mega: every generate runs with those flags; tests/mega.cmake)
set -u
weld=$1 tmp=$2
shift 2
xflags=("$@")
. "$(dirname "$0")/lib.sh"

require_stories
mkdir -p "$tmp"
golden="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
golden_ids="432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394"

out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 2>/dev/null)
expect_eq "$out" "$golden" "gguf greedy text"
out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 --no-echo 2>/dev/null)
expect_eq "$out" "${golden#Once upon a time}" "gguf greedy --no-echo"
ids=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 --show-ids 2>&1 >/dev/null | head -1)
expect_eq "$(echo $ids)" "$golden_ids" "gguf greedy ids"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 8 --temp 0 2>&1 >/dev/null)
expect_contains "$err" "tok/s" "speed line on stderr"

rm -rf "$tmp/stories-hf"
if "$weld" convert "$model" "$tmp/stories-hf" >/dev/null 2>&1; then
  ok
  out=$("$weld" generate "${xflags[@]}" -m "$tmp/stories-hf" -p "Once upon a time" -n 32 --temp 0 2>/dev/null)
  expect_eq "$out" "$golden" "hf dir greedy text"
else
  bad "weld convert to HF directory failed"
fi

a=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 7 2>/dev/null)
b=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 7 2>/dev/null)
c=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 8 2>/dev/null)
expect_eq "$a" "$b" "same seed same text"
[ "$a" != "$c" ] && ok || bad "different seeds gave the same 40 sampled tokens"

out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 --accelerator cpu 2>/dev/null)
expect_eq "$out" "$golden" "--accelerator cpu"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 --accelerator nope 2>&1); rc=$?
expect_eq "$rc" "1" "unknown accelerator exit status"
expect_contains "$err" "--accelerator: unknown accelerator 'nope' (available: cpu)" \
  "unknown accelerator lists the available ones"
for x in ref ops mega; do # every executor gives the golden text (bit-identical logits)
  out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 --exec $x -t 2 2>/dev/null)
  expect_eq "$out" "$golden" "--exec $x"
done
out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 --exec ops --tune repack=0 \
      --tune kv_groups=1 --tune decode_pairs=long --tune l2_prefetch=1 2>/dev/null)
expect_eq "$out" "$golden" "--tune settings that keep the numbers"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 --exec megakernel 2>&1); rc=$?
expect_eq "$rc" "1" "unknown executor exit status"
expect_contains "$err" "--exec: unknown executor 'megakernel' (available: ref, ops, mega)" \
  "unknown executor lists the available ones"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 --tune nope=1 2>&1); rc=$?
expect_eq "$rc" "1" "unknown --tune key exit status"
expect_contains "$err" "unknown key 'nope' (keys: kv_groups, k_parts," "unknown --tune key lists the keys"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 --tune k_parts=two 2>&1); rc=$?
expect_contains "$err" "k_parts=two: k_parts takes a number from 1 to 4" "bad --tune value says why"

err=$("$weld" generate "${xflags[@]}" -m "$tmp/missing.gguf" -p "Hi" 2>&1); rc=$?
expect_eq "$rc" "1" "missing model exit status"
expect_contains "$err" "missing.gguf" "missing model named"
head -c 1000 "$model" > "$tmp/truncated.gguf"
err=$("$weld" generate "${xflags[@]}" -m "$tmp/truncated.gguf" -p "Hi" 2>&1); rc=$?
expect_eq "$rc" "1" "truncated model exit status"
expect_contains "$err" "truncated.gguf" "truncated model named"
"$weld" generate -p "Hi" >/dev/null 2>&1; expect_eq "$?" "2" "missing -m is a usage error"

# speculative decoding changes no token: ngram lookup, the model drafting for itself with
# llama.cpp's -md, vLLM's JSON form; the acceptance line goes to stderr
for spec in "--speculative-config {\"method\":\"ngram\",\"num_speculative_tokens\":3}" \
            "-md $model" "--speculative-config {\"model\":\"$model\",\"num_speculative_tokens\":5}"; do
  read -r -a sflags <<< "$spec"
  out=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 32 --temp 0 "${sflags[@]}" \
        2>"$tmp/spec-err.txt")
  expect_eq "$out" "$golden" "greedy with $spec"
  expect_contains "$(cat "$tmp/spec-err.txt")" "mean accepted length" "acceptance line with $spec"
done
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 16 --temp 0 -md "$model" 2>&1 >/dev/null)
expect_contains "$err" "drafted tokens accepted (100.0%)" "a model drafting for itself: every guess kept"
a=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 7 -md "$model" 2>/dev/null)
b=$("$weld" generate "${xflags[@]}" -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 7 2>/dev/null)
expect_eq "$a" "$b" "seeded sampling with a draft: the same text"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 -md "$tmp/nope.gguf" 2>&1); rc=$?
expect_eq "$rc" "1" "missing draft model exit status"
expect_contains "$err" "nope.gguf" "missing draft model named"
err=$("$weld" generate "${xflags[@]}" -m "$model" -p "Hi" -n 4 --speculative-config '{"method":"eagle"}' 2>&1); rc=$?
expect_eq "$rc" "1" "unknown speculative method exit status"
expect_contains "$err" "eagle" "unknown speculative method named"

for c in generate info tokenize convert mkmodel; do
  "$weld" $c --help >/dev/null 2>&1 && ok || bad "weld $c --help"
done
out=$("$weld" --help) && ok || bad "weld --help"
for w in "--exec mega|ops|ref" "--tune KEY=VALUE" kv_groups dump_program "--pair" WELD_LOG WELD_ISA \
         WELD_TRACE WELD_REGEX_MATCH_LIMIT docs/TUNING.md; do
  expect_contains "$out" "$w" "weld --help names $w"
done

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
