#!/usr/bin/env bash
# `make model` (scripts/fetch-model.sh) without a network: file:// URLs stand in for the
# download. An existing file is kept and nothing is fetched; a good download lands at its
# place; a failed download or a wrong sha256 exits 1, leaves nothing behind and says what
# to do; `make -n model` fetches the model the shared README describes, by its sha256.
# usage: make_model.sh SOURCE_DIR SCRATCH_DIR
set -u
src=$1 tmp=$2
fetch=$src/scripts/fetch-model.sh
. "$(dirname "$0")/lib.sh"
rm -rf "$tmp"
mkdir -p "$tmp/origin"
head -c 4096 /dev/urandom > "$tmp/origin/m.gguf"
sha=$(sha256sum "$tmp/origin/m.gguf" | cut -d' ' -f1)
url="file://$tmp/origin/m.gguf"

# present: left alone, no download tried (the URL could not be fetched)
mkdir -p "$tmp/have"
echo keep > "$tmp/have/m.gguf"
out=$("$fetch" "file://$tmp/none" "$tmp/have/m.gguf" "$sha" 2>&1); rc=$?
expect_eq "$rc" "0" "present: exit"
expect_eq "$(cat "$tmp/have/m.gguf")" "keep" "present: file untouched"
expect_contains "$out" "is present" "present: message"

# a good download
out=$("$fetch" "$url" "$tmp/new/models/m.gguf" "$sha" 2>&1); rc=$?
expect_eq "$rc" "0" "download: exit [$out]"
cmp -s "$tmp/origin/m.gguf" "$tmp/new/models/m.gguf" && ok || bad "download: bytes differ"
[ ! -e "$tmp/new/models/m.gguf.part" ] && ok || bad "download: .part left"

# a failed download
out=$("$fetch" "file://$tmp/none" "$tmp/fail/m.gguf" "$sha" 2>&1); rc=$?
expect_eq "$rc" "1" "failed download: exit"
expect_contains "$out" "download failed" "failed download: says so"
expect_contains "$out" "place it at" "failed download: says what to do"
[ -z "$(ls -A "$tmp/fail" 2>/dev/null)" ] && ok || bad "failed download: files left"

# a wrong checksum
out=$("$fetch" "$url" "$tmp/bad/m.gguf" "0000$sha" 2>&1); rc=$?
expect_eq "$rc" "1" "wrong sha256: exit"
expect_contains "$out" "expected 0000$sha" "wrong sha256: names both"
[ -z "$(ls -A "$tmp/bad" 2>/dev/null)" ] && ok || bad "wrong sha256: files left"

# an unwritable destination
mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
if [ -w "$tmp/ro" ]; then ok; else
  out=$("$fetch" "$url" "$tmp/ro/m.gguf" "$sha" 2>&1); rc=$?
  expect_eq "$rc" "1" "read-only directory: exit"
  expect_contains "$out" "cannot write to $tmp/ro" "read-only directory: says so"
fi
chmod 755 "$tmp/ro"

# the Makefile's target: the shared README's stories260K.gguf, into SHARED/models
cmd=$(make -s -n -C "$src" model SHARED="$tmp/shared" 2>/dev/null)
expect_contains "$cmd" "fetch-model.sh" "make -n model: runs the script"
expect_contains "$cmd" "$tmp/shared/models/stories260K.gguf" "make -n model: destination"
expect_contains "$cmd" "047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b" \
  "make -n model: sha256 of the shared README"
expect_contains "$cmd" "https://huggingface.co/" "make -n model: the public origin"

echo "$passes passed, $fails failed"
[ "$passes" -gt 0 ] && [ "$fails" -eq 0 ]
