#!/bin/sh
# record-llamacpp-oracle.sh - re-record tests/data/llamacpp_oracle/*.json, llama.cpp's
# greedy ids, top logits and tokenizations for random-weight models that `weld mkmodel
# --seed` regenerates (test_exec_llamacpp_oracle compares weld against them). Not part
# of the test run: it needs a llama.cpp checkout outside this repository.
#
#   scripts/record-llamacpp-oracle.sh LLAMA_CPP_DIR [WELD_BUILD_DIR]
#
# LLAMA_CPP_DIR: a llama.cpp source tree; its build/ is made (CPU, Release, shared
# libraries, only libllama) when build/bin/libllama.so is missing. The data in the
# repository was recorded with commit 81ff7abe. WELD_BUILD_DIR (default build) holds the
# `weld` binary. Needs node (the tokenizer corpus), cc, jansson and xxhash headers, and
# tests/node/node_modules (the tokenizers).
#
# Each case below is a file name and its `weld mkmodel` arguments (the --out is added);
# the test reads the arguments back from the JSON, so a case is added here only. The
# quantized sparse cases' seeds are ones at which weld and llama.cpp choose the same
# experts at every position (their tiny routers have near-ties that activation rounding
# flips; see the test's comment): if a re-record fails there, check each side against
# `weld convert X.gguf X-f32.gguf --dtype f32` before suspecting the code.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 LLAMA_CPP_DIR [WELD_BUILD_DIR]" >&2; exit 2; }
llama=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
weld=$(cd "${2:-$src/build}" && pwd)/weld
out=$src/tests/data/llamacpp_oracle
[ -x "$weld" ] || { echo "$0: no weld binary at $weld" >&2; exit 1; }

if [ ! -f "$llama/build/bin/libllama.so" ]; then
  cmake -S "$llama" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF
  cmake --build "$llama/build" -j"$(nproc)" --target llama
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I"$llama/include" -I"$llama/ggml/include" \
  "$src/scripts/llamacpp_record.c" -o "$tmp/record" -L"$llama/build/bin" -lllama -lggml \
  -lggml-base -ljansson -lxxhash -Wl,-rpath,"$llama/build/bin"
commit=$(git -C "$llama" rev-parse --short=8 HEAD 2>/dev/null || echo unknown)

# Prompts (tokenized by llama.cpp) and the tokenizer corpus: the hand-written cases of
# tests/data/tokenizer_cases.jsonl and every 8th generated string of the parity corpus
# (not those with a NUL or a lone surrogate, which llama_tokenize cannot take). Cases marked
# corpus-nfc get it in Unicode NFC: their tokenizer.json (Qwen) normalizes to NFC first,
# which llama.cpp does not do, so only normalized text is comparable.
cat > "$tmp/prompts.jsonl" <<'EOF'
"Once upon a time"
"The quick brown fox jumps over the lazy dog. 1234 + 5678 = 6912; naïve café 日本語"
"Hi"
EOF
corpus() {
(cd "$src/tests/node" && node -e '
  const c = require("./tokenizer_corpus.js").corpus();
  const n = require("fs").readFileSync("../data/tokenizer_cases.jsonl", "utf8")
    .split("\n").filter((l) => l.length).length;
  for (let i = 0; i < c.length; i++)
    if ((i < n || (i - n) % 8 === 0) && c[i].isWellFormed() && !c[i].includes("\0"))
      console.log(JSON.stringify(process.argv[1] === "nfc" ? c[i].normalize("NFC") : c[i]));
' "$1") > "$tmp/corpus$2.jsonl"
}
corpus plain ""
corpus nfc -nfc

tok=tests/node/node_modules/@lenml
small="--layers 2 --dim 256 --heads 4 --kv-heads 2 --ffn 512 --tied -t $tok/tokenizer-llama2/models"
tiny="--preset tiny -t $tok/tokenizer-llama2/models"
mkdir -p "$out"
while IFS='|' read -r name corpus args; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086 # args is a word list
  (cd "$src" && "$weld" mkmodel $args --out "$tmp/$name.gguf" 2>/dev/null)
  c=-
  [ "$corpus" = corpus ] && c=$tmp/corpus.jsonl
  [ "$corpus" = corpus-nfc ] && c=$tmp/corpus-nfc.jsonl
  # shellcheck disable=SC2086
  (cd "$src" && LLAMACPP_COMMIT=$commit "$tmp/record" "$tmp/$name.gguf" 16 5 \
    "$tmp/prompts.jsonl" "$c" -- $args) > "$out/$name.json"
  rm -f "$tmp/$name.gguf"
  echo "recorded $out/$name.json"
done <<EOF
llama2_f32|corpus|--arch llama --layers 2 --dim 128 --heads 4 --ffn 256 --untied -t $tok/tokenizer-llama2/models --seed 1
mistral_f32||--arch llama --layers 2 --dim 128 --heads 8 --kv-heads 2 --head-dim 32 --ffn 384 --rope-theta 1000000 --untied -t $tok/tokenizer-llama2/models --seed 2
llama3_f32|corpus|--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --rope-theta 500000 --rope-scaling llama3 --rope-factor 8 --rope-orig-ctx 64 --tied -t $tok/tokenizer-llama3/models --seed 3
qwen2_f32||--arch qwen2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --tied -t $tok/tokenizer-qwen3/models --seed 4
qwen3_f32|corpus-nfc|--arch qwen3 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 32 --ffn 128 --tied -t $tok/tokenizer-qwen3/models --seed 5
llama_f16||--arch llama $small --dtype f16 --seed 10
llama_bf16||--arch llama $small --dtype bf16 --seed 11
llama_q8_0||--arch llama $small --dtype q8_0 --seed 12
llama_q4_0||--arch llama $small --dtype q4_0 --seed 13
llama_q4_1||--arch llama $small --dtype q4_1 --seed 14
llama_q5_0||--arch llama $small --dtype q5_0 --seed 15
llama_q5_1||--arch llama $small --dtype q5_1 --seed 16
llama_q4_K||--arch llama $small --dtype q4_K --seed 17
llama_q5_K||--arch llama $small --dtype q5_K --seed 18
llama_q6_K||--arch llama $small --dtype q6_K --seed 19
qwen3moe_f32||--arch qwen3-moe $tiny --dtype f32 --seed 20
qwen3moe_q8_0||--arch qwen3-moe $tiny --dtype q8_0 --seed 21
mixtral_f32||--arch mixtral $tiny --dtype f32 --seed 22
qwen2moe_f32||--arch qwen2-moe $tiny --dtype f32 --seed 23
deepseek3_f32||--arch deepseek-v3 $tiny --dtype f32 --seed 24
deepseek3_q8_0||--arch deepseek-v3 $tiny --dim 256 --dtype q8_0 --seed 28
deepseek3_q4_0||--arch deepseek-v3 $tiny --dim 256 --dtype q4_0 --seed 26
EOF
