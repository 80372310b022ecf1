#!/usr/bin/env bash
# Tensor parallelism across "machines": two ranks in two network namespaces joined by a
# veth pair, so Open MPI's TCP transport carries every exchange (shared memory is off and
# the namespaces share no interface). mpirun runs in the first namespace and starts the
# second rank through its rsh launcher, whose "ssh" is `ip netns exec` (the hostfile's
# addresses are the namespaces'). The batch results equal one process with --k-parts 2,
# and the second namespace's interface carried the traffic.
# usage: WELD_SHARED=DIR cli_tp_netns.sh WELD_BIN SCRATCH_DIR   (exit 77: skipped without
# mpirun, or without the right to make network namespaces: root, CAP_SYS_ADMIN)
set -u
weld=$(realpath "$1") tmp=$2
. "$(dirname "$0")/lib.sh"

require_stories
for c in mpirun node ip; do
  if ! command -v $c >/dev/null; then
    echo "skipped: $c not found (scripts/install-deps.sh installs mpirun and node)"
    exit 77
  fi
done
mkdir -p "$tmp"
tmp=$(realpath "$tmp")
a=wA$$ b=wB$$ va=vA$$ vb=vB$$
cleanup() { ip netns del $a 2>/dev/null; ip netns del $b 2>/dev/null; }
trap cleanup EXIT
if ! ip netns add $a 2>/dev/null; then
  echo "skipped: cannot make network namespaces here (needs root with CAP_SYS_ADMIN)"
  exit 77
fi
ip netns add $b && ip link add $va type veth peer name $vb && ip link set $va netns $a &&
  ip link set $vb netns $b && ip -n $a addr add 10.77.0.1/24 dev $va &&
  ip -n $b addr add 10.77.0.2/24 dev $vb && ip -n $a link set lo up && ip -n $b link set lo up &&
  ip -n $a link set $va up && ip -n $b link set $vb up
expect_eq "$?" "0" "namespaces and veth pair"

cat > "$tmp/rsh.sh" <<RSH
#!/bin/sh
# ssh stand-in for Open MPI's launcher: run the command in the namespace of the address
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case "\$host" in 10.77.0.1) ns=$a ;; 10.77.0.2) ns=$b ;; *) echo "unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns /bin/sh -c "\$*"
RSH
chmod +x "$tmp/rsh.sh"
printf "10.77.0.1 slots=1\n10.77.0.2 slots=1\n" > "$tmp/hosts"

in="$tmp/in.jsonl"
: > "$in"
for i in 0 1 2 3; do
  echo "{\"prompt\": \"Once upon a time $i\", \"max_tokens\": 24, \"temperature\": 0.9, \"seed\": $i, \"logprobs\": 2}" >> "$in"
done
"$weld" batch -m "$model" --input "$in" --output "$tmp/k2.jsonl" --k-parts 2 -t 1 2>/dev/null
rx0=$(ip -n $b -s link show $vb | awk '/RX:/ {getline; print $1}')
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 ip netns exec $a \
  mpirun --hostfile "$tmp/hosts" --mca plm_rsh_agent "$tmp/rsh.sh" --mca btl tcp,self \
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 --bind-to none -np 2 \
  "$weld" batch -m "$model" --input "$in" --output "$tmp/tcp.jsonl" -tp 2 -t 1 2> "$tmp/tcp.err"
expect_eq "$?" "0" "mpirun over TCP between namespaces ($(tail -2 "$tmp/tcp.err"))"
rx1=$(ip -n $b -s link show $vb | awk '/RX:/ {getline; print $1}')
same=$(node -e '
const fs = require("fs");
const rd = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
const strip = (o) => Array.isArray(o) ? o.map(strip) : o && typeof o === "object" ?
  Object.fromEntries(Object.entries(o).filter(([k]) => k !== "timings").map(([k, v]) => [k, strip(v)])) : o;
const a = JSON.stringify(strip(rd(process.argv[1]))), b = JSON.stringify(strip(rd(process.argv[2])));
process.stdout.write(a === b && a.length > 2 ? "same" : "differ");' "$tmp/k2.jsonl" "$tmp/tcp.jsonl")
expect_eq "$same" "same" "TCP ranks equal --k-parts 2"
expect_eq "$([ $((rx1 - rx0)) -gt 100000 ] && echo carried)" "carried" \
  "the veth carried the exchanges ($((rx1 - rx0)) bytes)"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
