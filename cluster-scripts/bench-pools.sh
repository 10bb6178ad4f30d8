#!/usr/bin/env bash
# Compare pools on one isolated cluster in the same run (root: namespaces and loop devices):
#   bash cluster-scripts/bench-pools.sh HOSTS OSDS_PER_HOST NAME "POOL SPEC" [NAME "POOL SPEC"...]
#   e.g. bash cluster-scripts/bench-pools.sh 3 2 rep "--replicated 3" \
#            ec "--erasure 4+2 --osds-per-domain 2"
# For each of two rounds and each pool: `cairn bench cluster --op write` then `--op seq`
# (4 MiB objects, 16 in flight, 20 s each; objects removed after), one JSON line each, and the
# CPU seconds all OSD processes used during the write (from the bench's cpu_s_per_1000_ops).
# DEVSIZE (default 12G) sizes each OSD's sparse device: a 20 s replicated write at ~350 MB/s
# fills 4G devices. UP_ARGS adds options to `cairn-cluster up` (e.g. UP_ARGS="--mtu 1500").
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { sed -n 2,10p "$0"; exit 2; }
hosts=$1 per_host=$2; shift 2
CC=.venv/bin/cairn-cluster; C=.venv/bin/cairn
D=/var/tmp/cairn-bench-pools
"$CC" down --dir "$D" --purge >/dev/null 2>&1 || true
trap '"$CC" down --dir "$D" --purge >/dev/null 2>&1 || true' EXIT
# shellcheck disable=SC2086  # UP_ARGS is several options
"$CC" up --dir "$D" --hosts "$hosts" --osds-per-host "$per_host" --isolated \
  --device-size "${DEVSIZE:-12G}" ${UP_ARGS:-} | tail -1
export CAIRN_CLUSTER=$D
pools=()
while [ $# -ge 2 ]; do
  # shellcheck disable=SC2086  # the spec is several options
  "$C" pool create "$1" $2 --pg-num "${PG_NUM:-32}" | tail -1
  pools+=("$1"); shift 2
done
for round in 1 2; do
  for pool in "${pools[@]}"; do
    out=$("$C" bench cluster --pool "$pool" --op write --size 4M --concurrency 16 --seconds 20 \
          --json | tail -1)
    echo "round $round $pool write $out osd_cpu_s=$(python3 -c "import json, sys
result = json.loads(sys.argv[1])
print(round(result['cpu_s_per_1000_ops']['osd'] * result['ops'] / 1000, 1))" "$out")"
    out=$("$C" bench cluster --pool "$pool" --op seq --size 4M --concurrency 16 --seconds 20 \
          --json --cleanup | tail -1)
    echo "round $round $pool seq $out"
  done
done
