#!/usr/bin/env bash
# Offline throughput of weld's engine beside llama.cpp on the same workload, in one
# invocation: N random prompts of I tokens, O output tokens each, P sequences at a time.
#
#   bench/throughput-vs-llamacpp.sh LLAMA_CPP_BIN_DIR MODEL.gguf [N I O P [THREADS]]
#   (defaults: N=64 I=512 O=128 P=16 THREADS=2; WELD_BIN overrides the weld binary,
#    default build/weld)
#
# weld:      weld bench throughput --dataset random --num-prompts N --input-len I
#            --output-len O --max-num-seqs P --json  (continuous batching, greedy,
#            ignore_eos), plus the same requests one at a time (--compare sequential).
# llama.cpp: llama-batched-bench -npp I -ntg O -npl P (P prompts prefilled, then P
#            sequences decoded together: llama.cpp's parallel decoding), whose rate for one
#            batch of P is its rate for N/P such batches.
# Printed: output tokens/s = generated tokens / wall time including prefill, and total
# tokens/s = (prompt + generated) / wall time, for each, and weld / llama.cpp.
set -eu
if [ $# -lt 2 ]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
llama_dir=$1 model=$2
n=${3:-64} ilen=${4:-512} olen=${5:-128} par=${6:-16} threads=${7:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
weld=${WELD_BIN:-$here/build/weld}
[ -x "$weld" ] || { echo "weld binary not found: $weld (set WELD_BIN)" >&2; exit 1; }
[ -x "$llama_dir/llama-batched-bench" ] || { echo "$llama_dir/llama-batched-bench not found" >&2; exit 1; }
[ -f "$model" ] || { echo "model not found: $model" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed to read the JSON results" >&2; exit 1; }

echo "workload: $n prompts x $ilen tokens, $olen output tokens, $par at a time, $threads threads; model $model"
wj=$("$weld" bench throughput -m "$model" --dataset random --num-prompts "$n" \
       --input-len "$ilen" --output-len "$olen" --max-num-seqs "$par" --compare sequential --json)
ctx=$((par * (ilen + olen) + 256))
lj=$("$llama_dir/llama-batched-bench" -m "$model" -c "$ctx" -b 2048 -ub 512 -npp "$ilen" \
       -ntg "$olen" -npl "$par" -t "$threads" -tb "$threads" --output-format jsonl 2>/dev/null |
     grep '^{"n_kv_max"' | tail -1)
[ -n "$lj" ] || { echo "llama-batched-bench printed no result" >&2; exit 1; }
python3 - "$wj" "$lj" <<'PY'
import json, sys
w, l = json.loads(sys.argv[1]), json.loads(sys.argv[2])
wr, ws = w["result"], w["compare_result"]
l_out = l["pl"] * l["tg"] / l["t"]
l_tot = l["speed"]
print("%-34s %12s %12s" % ("", "output tok/s", "total tok/s"))
print("%-34s %12.2f %12.2f" % ("weld (continuous batching)", wr["output_tok_s"], wr["total_tok_s"]))
print("%-34s %12.2f %12.2f" % ("weld (one at a time)", ws["output_tok_s"], ws["total_tok_s"]))
print("%-34s %12.2f %12.2f" % ("llama.cpp llama-batched-bench", l_out, l_tot))
print("weld batching / weld one at a time: %.2fx" % (wr["output_tok_s"] / ws["output_tok_s"]))
print("weld / llama.cpp (output tok/s):    %.2fx" % (wr["output_tok_s"] / l_out))
print("weld / llama.cpp (total tok/s):     %.2fx" % (wr["total_tok_s"] / l_tot))
PY
