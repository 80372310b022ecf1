#!/usr/bin/env bash
# Functional checks of `weld bench -m MODEL` and `weld bench --bandwidth` on stories260K
# (-r 1 -p 16 -n 8, a small probe): --json prints exactly one JSON object with every field
# of issue 5's schema and sane values (positive rates, min <= median <= max, token counts
# as asked, gb_s = share x probe_gb_s), the table names pp/tg and the bandwidth, `weld
# bench throughput` still dispatches to its own command, and bad options fail with a
# message, and -b B decodes B sequences at once. Timing values are not judged.
# usage: WELD_SHARED=DIR cli_bench.sh WELD_BIN   (exit 77: skipped)
set -u
weld=$1
. "$(dirname "$0")/lib.sh"

require_stories
if ! command -v node >/dev/null; then
  echo "skipped: node not found (scripts/install-deps.sh installs it)"
  exit 77
fi

# The JSON report: one line, every field, sane values.
out=$("$weld" bench -m "$model" -r 2 -p 16 -n 8 -t 1 --probe-size 64M --json 2>/dev/null)
rc=$?
[ $rc -eq 0 ] && ok || bad "bench --json exited $rc"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && ok || bad "bench --json: not one line: [$out]"
msg=$(printf '%s' "$out" | node -e '
  const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const errs = [];
  const num = (v, k) => { if (typeof v !== "number" || !isFinite(v)) errs.push(k + " not a number"); };
  if (typeof j.model !== "string" || !j.model.endsWith("stories260K.gguf")) errs.push("model");
  if (j.threads !== 1) errs.push("threads " + j.threads);
  if (!["scalar", "avx2", "avx512", "amx"].includes(j.isa)) errs.push("isa " + j.isa);
  for (const [k, n] of [["pp", 16], ["tg", 8]]) {
    const s = j[k];
    if (!s) { errs.push(k + " missing"); continue; }
    if (s.tokens !== n) errs.push(k + ".tokens " + s.tokens);
    for (const f of ["tok_s_median", "tok_s_min", "tok_s_max"]) num(s[f], k + "." + f);
    if (!(s.tok_s_min > 0 && s.tok_s_min <= s.tok_s_median && s.tok_s_median <= s.tok_s_max))
      errs.push(k + ": not 0 < min <= median <= max");
    if (Object.keys(s).length !== 4) errs.push(k + ": extra fields");
  }
  const b = j.bandwidth || {};
  for (const f of ["gb_s", "probe_gb_s", "share", "paired_share"]) num(b[f], "bandwidth." + f);
  if (!(b.gb_s > 0 && b.probe_gb_s > 0 && b.share > 0 && b.paired_share > 0))
    errs.push("bandwidth not positive");
  if (Math.abs(b.share * b.probe_gb_s - b.gb_s) > 1e-6 * b.gb_s) errs.push("share != gb_s / probe_gb_s");
  const c = j.compute || {};
  for (const f of ["prefill_gop", "matmul_share", "gops", "peak_gops", "share"]) num(c[f], "compute." + f);
  if (!(c.prefill_gop > 0 && c.matmul_share > 0.5 && c.matmul_share <= 1 && c.gops > 0))
    errs.push("compute figures out of range");
  /* stories260K is F32: FMA under AVX-512 / AVX2, no probe for scalar code */
  if (j.isa === "scalar" ? !(c.instr === null && c.peak_gops === 0 && typeof c.no_peak === "string")
                         : !(/^vfmadd231ps/.test(c.instr) && c.peak_gops > 0 && c.no_peak === null))
    errs.push("compute peak: " + JSON.stringify(c));
  if (c.peak_gops > 0 && Math.abs(c.share * c.peak_gops - c.gops) > 1e-6 * c.gops)
    errs.push("share != gops / peak_gops");
  if (Object.keys(j).sort().join() !== "bandwidth,compute,isa,model,pp,tg,threads") errs.push("top-level keys " + Object.keys(j));
  console.log(errs.length ? errs.join("; ") : "ok");
' 2>&1)
[ "$msg" == "ok" ] && ok || bad "bench --json schema: $msg [$out]"

# Batched decode: -b 3 decodes three sequences at once; tg counts all their tokens, the
# object names the batch, and the table says which batch the executor figures are for.
out=$("$weld" bench -m "$model" -r 1 -p 8 -n 4 -b 3 -t 1 --probe-size 16M --json 2>/dev/null)
msg=$(printf '%s' "$out" | node -e '
  const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
  console.log(j.batch === 3 && j.tg.tokens === 12 && j.pp.tokens === 8 && j.tg.tok_s_median > 0 ? "ok" : "bad");' 2>&1)
[ "$msg" == "ok" ] && ok || bad "bench -b 3 --json: [$out]"
out=$("$weld" bench -m "$model" -r 1 -p 8 -n 4 -b 2 -t 2 --probe-size 16M 2>&1)
expect_contains "$out" "(all sequences)" "bench -b 2 table"
case "$out" in *"executor "*) expect_contains "$out" "(batch 2)" "bench -b 2 executor line" ;; esac
out=$("$weld" bench -m "$model" -b 0 2>&1)
expect_contains "$out" "-b must be in [1, 256]" "bench -b 0"

# WELD_ISA=scalar is reported as such.
out=$(WELD_ISA=scalar "$weld" bench -m "$model" -r 1 -p 4 -n 2 -t 1 --probe-size 16M --json 2>/dev/null)
expect_contains "$out" '"isa":"scalar"' "WELD_ISA=scalar"

# The table.
out=$("$weld" bench -m "$model" -r 1 -p 16 -n 8 -t 1 --probe-size 64M 2>&1)
expect_contains "$out" "pp             16" "table pp row"
expect_contains "$out" "tg              8" "table tg row"
expect_contains "$out" "decode bandwidth:" "table bandwidth line"
expect_contains "$out" "run right after each repetition" "table paired bandwidth line"
expect_contains "$out" "prefill compute:" "table compute line"
out=$(WELD_ISA=scalar "$weld" bench -m "$model" -r 1 -p 4 -n 2 -t 1 --probe-size 16M 2>&1)
expect_contains "$out" "no peak figure (scalar code)" "scalar: no compute peak"

# The probe alone.
out=$("$weld" bench --bandwidth -t 1 --probe-size 32M --json 2>/dev/null)
msg=$(printf '%s' "$out" | node -e '
  const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
  console.log(j.threads === 1 && j.passes === 5 && j.bytes > 0 && j.probe_gb_s > 0 &&
              j.probe_gb_s >= j.probe_gb_s_median ? "ok" : "bad");' 2>&1)
[ "$msg" == "ok" ] && ok || bad "bench --bandwidth --json: [$out]"

# The handoff probe: four data sizes, positive round trips (one core: a clear refusal).
if out=$("$weld" bench --handoff --json 2>&1); then
  msg=$(printf '%s' "$out" | node -e '
    const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
    const h = j.handoff;
    console.log(h.length === 4 && h[0].lines === 0 && h[3].lines === 16 &&
                h.every(x => x.round_trip_ns > 0) ? "ok" : "bad");' 2>&1)
  [ "$msg" == "ok" ] && ok || bad "bench --handoff --json: [$out]"
else
  expect_contains "$out" "needs two physical cores" "bench --handoff on one core"
fi
out=$("$weld" bench --handoff -m "$model" 2>&1)
expect_contains "$out" "--handoff goes alone" "bench --handoff with -m"

# Two executors interleaved: both sides, ratios, block size as asked; -r repetitions in each
# creation order, the median the two orders' medians combined.
out=$("$weld" bench -m "$model" --pair mega:2,ref:1 --block 4 -r 2 -p 8 -n 16 --json 2>/dev/null)
msg=$(printf '%s' "$out" | node -e '
  const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const [a, b] = j.sides;
  const ok = a.executor === "mega" && b.executor === "ref" && b.threads === 1 &&
    a.tg_tok_s > 0 && b.tg_tok_s > 0 && a.pp_tok_s > 0 && a.bubble >= 0 && !("bubble" in b) &&
    j.block_steps === 4 && j.tg_ratio.pairs === 16 && j.pp_ratio.pairs === 4 &&
    j.tg_ratio.p10 <= j.tg_ratio.median && j.tg_ratio.median <= j.tg_ratio.p90 &&
    j.tg_ratio.median > 0 &&
    Math.abs(j.tg_ratio.median - Math.sqrt(j.tg_ratio.a_first * j.tg_ratio.b_first)) < 1e-9 &&
    Math.abs(j.tg_ratio.order_bias - Math.sqrt(j.tg_ratio.a_first / j.tg_ratio.b_first)) < 1e-9;
  console.log(ok ? "ok" : "bad");' 2>&1)
[ "$msg" == "ok" ] && ok || bad "bench --pair --json: [$out]"
out=$("$weld" bench -m "$model" --pair mega,ops -r 1 -p 4 -n 16 2>&1)
expect_contains "$out" "tg mega / ops:" "bench --pair table"
# Settings per side (--tune's keys): the same executor, one or two weight streams per core,
# with --tune setting both sides' base.
out=$("$weld" bench -m "$model" --pair mega,mega@decode_pairs=1@repack=0 --tune kv_groups=1 \
      -r 1 -p 4 -n 16 --json 2>/dev/null)
msg=$(printf '%s' "$out" | node -e '
  const j = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const [a, b] = j.sides;
  console.log(a.side === "mega" && b.side === "mega@decode_pairs=1@repack=0" &&
    b.executor === "mega" && b.tg_tok_s > 0 ? "ok" : "bad");' 2>&1)
[ "$msg" == "ok" ] && ok || bad "bench --pair with a setting: [$out]"
out=$("$weld" bench -m "$model" --pair mega,mega@decode_pairs=7 -r 1 -p 4 -n 4 2>&1)
rc=$?
[ $rc -eq 2 ] && ok || bad "bench --pair decode_pairs=7: exit $rc, want 2 [$out]"
expect_contains "$out" "--pair side 'mega@decode_pairs=7': decode_pairs=7: decode_pairs takes 0, 1 or long" \
  "bench --pair bad setting message"
out=$("$weld" bench -m "$model" --pair mega,ops --exec ops -r 1 2>&1)
expect_contains "$out" "--exec does not go with --pair" "bench --pair with --exec"
out=$("$weld" bench -m "$model" --exec ops -r 1 -p 4 -n 4 -t 2 --probe-size 16M --json 2>/dev/null)
expect_contains "$out" '"executor":"ops"' "bench --exec ops"

# Dispatch and help.
out=$("$weld" bench --help 2>&1)
expect_contains "$out" "weld bench --bandwidth" "bench --help"
expect_contains "$out" "bench throughput" "bench --help lists throughput"
out=$("$weld" bench throughput --help 2>&1)
expect_contains "$out" "--dataset" "bench throughput --help"

# Bad usage: exit 2 with a message; a missing model: exit 1 naming it.
for args in "-p 0 -m $model" "-r 0 -m $model" "-n -1 -m $model" "" "-m $model --probe-size 1K" \
            "-m $model --pair mega" "-m $model --pair mega,fast" "-m $model --pair mega:0,ops" \
            "-m $model --pair mega,mega@PATH=1" "-m $model --pair mega@k_parts,ops" \
            "-m $model --tune nope=1" "-m $model --exec fast" \
            "-m $model --block 4"; do
  # shellcheck disable=SC2086
  out=$("$weld" bench $args 2>&1)
  rc=$?
  [ $rc -eq 2 ] && ok || bad "bench $args: exit $rc, want 2 [$out]"
  expect_contains "$out" "weld bench" "bench $args message"
done
out=$("$weld" bench -m /nonexistent.gguf -r 1 -p 4 -n 2 2>&1)
rc=$?
[ $rc -eq 1 ] && ok || bad "missing model: exit $rc"
expect_contains "$out" "/nonexistent.gguf" "missing model message"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
