#!/usr/bin/env bash
# The KV tier end to end through `weld batch` (engine/offload.h, kvtier/): prompts sharing
# long prefixes through a pool too small to keep them, so blocks are evicted and loaded
# back. Every run gives exactly the tokens of a run without the tier (greedy and seeded
# sampling, n > 1): with a file tier (loads within the run, then a restarted process warm
# from the directory), after every entry is damaged (refused, recomputed), under a byte
# budget, and through a Redis store shared by two processes (skipped without
# redis-server). Bad settings are refused with the reason.
# usage: WELD_SHARED=DIR cli_kvtier.sh WELD_BIN SCRATCH_DIR   (exit 77: skipped)
set -u
weld=$1 tmp=$2
. "$(dirname "$0")/lib.sh"

require_stories
if ! command -v node >/dev/null; then
  echo "skipped: node not found (scripts/install-deps.sh installs it)"
  exit 77
fi
rm -rf "$tmp"
mkdir -p "$tmp"
# 8 prefixes of 96 tokens, each asked twice with its own 8-token tail: 48 prefix blocks
# against a pool of 20 (200K at 10 KiB a block)
node -e '
let s = 7; const r = () => (s = (s * 1103515245 + 12345) % 2147483648) % 497 + 3;
const pre = [...Array(8)].map(() => [...Array(96)].map(r));
for (let round = 0; round < 2; round++)
  for (let g = 0; g < 8; g++) {
    const q = { id: `r${round}g${g}`, prompt_token_ids: [1, ...pre[g], ...[...Array(8)].map(r)],
                max_tokens: 8, ignore_eos: true };
    if (g % 3 == 2) Object.assign(q, { temperature: 0.8, seed: g, n: 2 });
    else q.temperature = 0;
    console.log(JSON.stringify(q));
  }' > "$tmp/req.jsonl"
tokens() { # the outputs of a results file, without timings and cache counts
  node -e 'for (const l of require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n")) {
    const o = JSON.parse(l); console.log(o.id, JSON.stringify(o.choices ? o.choices.map((c) => c.token_ids) : o.token_ids ?? o.error)); }' "$1"
}
loaded() { sed -n 's/.*kv tier: \([0-9]*\) of.*/\1/p' "$1"; }
rejected() { sed -n 's/.*blocks saved, \([0-9]*\) rejected.*/\1/p' "$1"; }
run() { # run NAME [options]
  local name=$1
  shift
  "$weld" batch -m "$model" --input "$tmp/req.jsonl" --output "$tmp/$name.jsonl" \
    --max-num-seqs 2 --kv-cache-memory 200K "$@" 2> "$tmp/$name.err"
  expect_eq "$?" 0 "$name: exit status"
}

run ref
want=$(tokens "$tmp/ref.jsonl")
expect_eq "$(echo "$want" | wc -l)" 16 "reference results"
expect_contains "$(cat "$tmp/ref.jsonl")" '"token_ids"' "reference results carry tokens"

# file tier: the second round loads what the first spilled; a new process loads it all
run file1 --kv-offload-dir "$tmp/tier"
expect_eq "$(tokens "$tmp/file1.jsonl")" "$want" "file tier, first run: same tokens"
[ "$(loaded "$tmp/file1.err")" -gt 0 ] && ok || bad "file tier, first run loads blocks: $(cat "$tmp/file1.err")"
n_files=$(find "$tmp/tier" -name '*.kvb' | wc -l)
[ "$n_files" -ge 48 ] && ok || bad "the pool's blocks are saved at exit: $n_files entries"
run file2 --kv-offload-dir "$tmp/tier"
expect_eq "$(tokens "$tmp/file2.jsonl")" "$want" "file tier, restarted: same tokens"
expect_contains "$(cat "$tmp/file2.err")" "hit rate 9" "a restarted process is warm (cached share)"

# every entry damaged: all refused and deleted, everything recomputed, same tokens
for f in $(find "$tmp/tier" -name '*.kvb'); do
  printf '\x55' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
done
run damaged --kv-offload-dir "$tmp/tier"
expect_eq "$(tokens "$tmp/damaged.jsonl")" "$want" "damaged entries: same tokens"
[ "$(rejected "$tmp/damaged.err")" -gt 0 ] && ok || bad "damaged entries are rejected: $(cat "$tmp/damaged.err")"
r0cached=$(node -e 'let n = 0; for (const l of require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n")) {
  const o = JSON.parse(l); if (o.id.startsWith("r0")) n += o.cached_tokens ?? o.choices[0].cached_tokens; } console.log(n)' "$tmp/damaged.jsonl")
expect_eq "$r0cached" 0 "nothing damaged is loaded (the first round computes every prompt)"

# a byte budget: the directory stays under it
run budget --kv-offload-dir "$tmp/small" --kv-offload-size 150K
expect_eq "$(tokens "$tmp/budget.jsonl")" "$want" "budgeted tier: same tokens"
bytes=$(find "$tmp/small" -name '*.kvb' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
[ "$bytes" -le 153600 ] && [ "$bytes" -gt 0 ] && ok || bad "budget of 150K kept: $bytes bytes"

# refusals
out=$("$weld" batch -m "$model" --input "$tmp/req.jsonl" --kv-offload-dir "$tmp/x" --no-prefix-caching 2>&1)
expect_contains "$out" "need prefix caching" "tier without prefix caching refused"
out=$("$weld" batch -m "$model" --input "$tmp/req.jsonl" --kv-offload-dir /proc/nope 2>&1)
expect_contains "$out" "--kv-offload-dir /proc/nope: cannot create" "unwritable directory refused"
out=$("$weld" batch -m "$model" --input "$tmp/req.jsonl" --kv-store http://x 2>&1)
expect_contains "$out" "--kv-store 'http://x': expected redis://" "bad store URL refused"
out=$("$weld" batch -m "$model" --input "$tmp/req.jsonl" --kv-store redis://127.0.0.1:1 2>&1)
expect_contains "$out" "cannot connect" "unreachable store refused at start"
out=$("$weld" batch -m "$model" --input "$tmp/req.jsonl" --kv-offload-dir "$tmp/x" -md "$model" 2>&1)
expect_contains "$out" "draft model" "tier with a draft model refused"

# a Redis store shared by two processes: B (no directory of its own) loads what A saved
if command -v redis-server >/dev/null; then
  sock="$tmp/redis.sock"
  redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no --loglevel warning \
    > "$tmp/redis.log" 2>&1 &
  rpid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  run storeA --kv-store "unix://$sock" --kv-offload-dir "$tmp/tierA"
  expect_eq "$(tokens "$tmp/storeA.jsonl")" "$want" "store, worker A: same tokens"
  run storeB --kv-store "unix://$sock"
  expect_eq "$(tokens "$tmp/storeB.jsonl")" "$want" "store, worker B: same tokens"
  expect_contains "$(cat "$tmp/storeB.err")" "hit rate 9" "worker B is warm from A's store"
  [ "$(loaded "$tmp/storeB.err")" -gt 0 ] && ok || bad "worker B loads from the store"
  kill "$rpid"
  wait "$rpid" 2>/dev/null
else
  echo "note: redis-server not found, the shared-store part did not run"
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
