#!/usr/bin/env bash
# Run every libFuzzer target in DIR for SECONDS each, JOBS at a time (default: the number of
# cores), seeded from tests/fuzz/corpus/<name>/. Any crash fails the run, and so does a DIR
# with no target or without a target of tests/fuzz/ (a fuzz build that built nothing, or
# not everything, must not pass). New inputs found go to a
# scratch corpus, not the source tree.
#   scripts/run-fuzz.sh build-fuzz/tests 10        the smoke run of `make test`
#   scripts/run-fuzz.sh build-fuzz/tests 600 1     `make fuzz-long`
set -euo pipefail
dir=$1
secs=${2:-10}
jobs=${3:-$(nproc)}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
srcs=("$root"/tests/fuzz/fuzz_*.c)
[ ${#srcs[@]} -gt 0 ] || { echo "fuzz: no tests/fuzz/fuzz_*.c" >&2; exit 1; }
for src in "${srcs[@]}"; do
  name=$(basename "$src" .c)
  [ -x "$dir/$name" ] || { echo "fuzz: $dir/$name not found (configure with -DWELD_FUZZ=ON, build --target fuzz_all)" >&2; exit 1; }
done
targets=()
for f in "$dir"/fuzz_*; do
  [ -x "$f" ] && targets+=("$f")
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no fuzz_* target in $dir (build with -DWELD_FUZZ=ON --target fuzz_all)" >&2
  exit 1
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# one target: its log and status go to $scratch/<name>.{log,rc}
run_one() {
  local f=$1 name work
  name=$(basename "$f")
  work="$scratch/$name.corpus"
  mkdir -p "$work"
  local seeds=()
  [ -d "$root/tests/fuzz/corpus/$name" ] && seeds+=("$root/tests/fuzz/corpus/$name")
  local rc=0
  "$f" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=0 \
    "$work" "${seeds[@]}" >"$scratch/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$scratch/$name.rc"
}

echo "fuzz: ${#targets[@]} targets, ${secs}s each, $jobs at a time"
running=0
for f in "${targets[@]}"; do
  run_one "$f" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

pass=0
fail=0
for f in "${targets[@]}"; do
  name=$(basename "$f")
  rc=$(cat "$scratch/$name.rc" 2>/dev/null || echo missing)
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
  else
    tail -40 "$scratch/$name.log"
    echo "fuzz: $name failed (exit $rc)"
    fail=$((fail + 1))
  fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
