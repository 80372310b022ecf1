#!/usr/bin/env bash
# Online serving of weld beside llama.cpp's llama-server on the same GGUF, in one
# invocation: the same `weld bench serve` load (same seed, same prompts byte for byte)
# against `weld serve` and then against `llama-server`, one server at a time.
#
#   bench/serve-vs-llamacpp.sh LLAMA_CPP_BIN_DIR MODEL.gguf [N C DATASET]
#   (defaults: N=128 requests, C=32 concurrent, DATASET=shared-prefix; environment:
#    INPUT_LEN=64 OUTPUT_LEN=64 PREFIX_LEN=256 NUM_GROUPS=8 RATE=inf SEED=0 THREADS=2,
#    ROUNDS=1, WELD_BIN (default build/weld), OUT_DIR (default a new temporary directory))
#
# Servers: weld serve MODEL --max-num-seqs C -t THREADS; llama-server -m MODEL -np C
# -c C*(P+I+O+16) -t THREADS (continuous batching is its default; +16 tokens per slot
# covers BOS and template tokens). Each server gets a free loopback port, is polled on
# /health until it answers 200, loaded, then stopped before the next one starts (the
# machine has 2 cores). Prompts are built with MODEL's own tokenizer (--tokenizer), so
# their token lengths are exact for both servers. No warm-up requests. ROUNDS > 1 repeats
# the pair in ABBA order (weld first in odd rounds) so load drift on a shared machine hits
# both sides alike.
# Printed: every vLLM-style summary, then per round the ratios p99 TTFT weld/llama (target
# <= 0.5) and request throughput weld/llama (target >= 1), plus median TTFT, TPOT and
# output tokens/s, and the median ratios over rounds. The result JSONs (with per-request
# arrays) and server logs stay in OUT_DIR.
set -eu
if [ $# -lt 2 ]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
llama_dir=$1 model=$2
n=${3:-128} conc=${4:-32} dataset=${5:-shared-prefix}
ilen=${INPUT_LEN:-64} olen=${OUTPUT_LEN:-64} plen=${PREFIX_LEN:-256} groups=${NUM_GROUPS:-8}
rate=${RATE:-inf} seed=${SEED:-0} threads=${THREADS:-2} rounds=${ROUNDS:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
weld=${WELD_BIN:-$here/build/weld}
[ -x "$weld" ] || { echo "weld binary not found: $weld (set WELD_BIN)" >&2; exit 1; }
[ -x "$llama_dir/llama-server" ] || { echo "$llama_dir/llama-server not found" >&2; exit 1; }
[ -f "$model" ] || { echo "model not found: $model" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed to read the JSON results" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl is needed to poll /health" >&2; exit 1; }
out=${OUT_DIR:-$(mktemp -d /tmp/serve-vs-llamacpp.XXXXXX)}
mkdir -p "$out"

server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_healthy() { # port log
  for _ in $(seq 1200); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health" || true)
    [ "$code" = 200 ] && return 0
    kill -0 "$server_pid" 2>/dev/null || { echo "server exited; log: $2" >&2; tail -5 "$2" >&2; exit 1; }
    sleep 0.1
  done
  echo "server not healthy after 120 s; log: $2" >&2
  exit 1
}

run_bench() { # name port
  echo
  echo "### $1"
  "$weld" bench serve --base-url "http://127.0.0.1:$2" --dataset "$dataset" \
    --num-prompts "$n" --max-concurrency "$conc" --request-rate "$rate" --input-len "$ilen" \
    --output-len "$olen" --prefix-len "$plen" --num-groups "$groups" --seed "$seed" \
    --tokenizer "$model" --save-result "$out/$1.json"
}

echo "workload: $dataset, $n requests, $conc concurrent, rate $rate, prefix $plen x $groups groups," \
     "input $ilen, output $olen, $threads threads; model $model"

run_weld() { # round
  port=$(free_port)
  "$weld" serve "$model" --port "$port" --max-num-seqs "$conc" -t "$threads" \
    >"$out/weld-serve-$1.log" 2>&1 &
  server_pid=$!
  wait_healthy "$port" "$out/weld-serve-$1.log"
  run_bench "weld-$1" "$port"
  stop_server
}

run_llama() { # round
  port=$(free_port)
  ctx=$((conc * (plen + ilen + olen + 16)))
  "$llama_dir/llama-server" -m "$model" --port "$port" -np "$conc" -c "$ctx" -t "$threads" \
    >"$out/llama-server-$1.log" 2>&1 &
  server_pid=$!
  wait_healthy "$port" "$out/llama-server-$1.log"
  run_bench "llama-server-$1" "$port"
  stop_server
}

for r in $(seq "$rounds"); do # ABBA: odd rounds weld first, even rounds llama-server first
  if [ $((r % 2)) = 1 ]; then run_weld "$r"; run_llama "$r"; else run_llama "$r"; run_weld "$r"; fi
done

echo
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
keys = [("completed", "successful requests"),
        ("request_throughput", "request throughput (req/s)"),
        ("output_throughput", "output tokens/s"),
        ("median_ttft_ms", "median TTFT (ms)"),
        ("p99_ttft_ms", "p99 TTFT (ms)"),
        ("median_tpot_ms", "median TPOT (ms)"),
        ("p99_e2el_ms", "p99 E2EL (ms)")]
ratios = {k: [] for k, _ in keys}
for r in range(1, rounds + 1):
    w = json.load(open("%s/weld-%d.json" % (out, r)))
    l = json.load(open("%s/llama-server-%d.json" % (out, r)))
    print("round %d %-26s %12s %12s %10s" % (r, "", "weld", "llama-server", "weld/llama"))
    for k, label in keys:
        q = w[k] / l[k] if l[k] else float("nan")
        ratios[k].append(q)
        print("  %-32s %12.2f %12.2f %10.2f" % (label, w[k], l[k], q))
med = lambda k: statistics.median(ratios[k])
print("p99 TTFT weld/llama:           %.2fx (target <= 0.50)%s" %
      (med("p99_ttft_ms"), " median of %d rounds" % rounds if rounds > 1 else ""))
print("request throughput weld/llama: %.2fx (target >= 1.00)%s" %
      (med("request_throughput"), " median of %d rounds" % rounds if rounds > 1 else ""))
PY
echo "results: $out"
