#!/usr/bin/env bash
# Run every libFuzzer target in DIR for SECONDS each, seeded from tests/fuzz/corpus/<name>/.
# Any crash fails the run, and so does a target of tests/fuzz/ missing from DIR (a build
# without -DWELD_FUZZ=ON runs nothing); new inputs found go to a scratch corpus, not the
# source tree.
set -euo pipefail
dir=$1
secs=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
n=0
srcs=("$root"/tests/fuzz/fuzz_*.c)
[ ${#srcs[@]} -gt 0 ] || { echo "fuzz: no tests/fuzz/fuzz_*.c"; exit 1; }
for src in "${srcs[@]}"; do
  name=$(basename "$src" .c)
  [ -x "$dir/$name" ] || { echo "fuzz: $dir/$name not found (configure with -DWELD_FUZZ=ON)"; exit 1; }
done
for f in "$dir"/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  work=$(mktemp -d)
  seeds=()
  [ -d "$root/tests/fuzz/corpus/$name" ] && seeds+=("$root/tests/fuzz/corpus/$name")
  echo "fuzz: $name for ${secs}s"
  "$f" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=0 \
    "$work" "${seeds[@]}" >"$work.log" 2>&1 || { tail -40 "$work.log"; echo "fuzz: $name crashed"; echo "fuzz: $n passed, 1 failed"; exit 1; }
  rm -rf "$work" "$work.log"
  n=$((n + 1))
done
echo "fuzz: $n passed, 0 failed"
