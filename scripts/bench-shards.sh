#!/usr/bin/env bash
# dlock on 1 and on 4 shards, in one run: 3 real `dlock serve` processes
# (etcd engine) per cluster, the uncontended (a ttl_ms lease per acquire)
# and session workloads with names spread over the ranges, and each node's
# CPU time per cycle over the measured window (dlock bench reads every
# node's process_cpu_seconds_total; CPU per cycle holds on a shared machine
# better than throughput does).
#
#   scripts/bench-shards.sh [--duration 10s] [--workers 32] [--base-port 27070]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=10s workers=32 base=27070
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --base-port) base=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
bin=$(mktemp -d)/dlock
go build -o "$bin" ./cmd/dlock
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; pids=(); }
trap cleanup EXIT

for shards in 1 4; do
  dir=$(mktemp -d)
  initial="n1=127.0.0.1:$((base+1)),n2=127.0.0.1:$((base+11)),n3=127.0.0.1:$((base+21))"
  for i in 0 1 2; do
    "$bin" serve --id "n$((i+1))" --data-dir "$dir/n$((i+1))" --raft-engine etcd --shards "$shards" \
      --api-addr "127.0.0.1:$((base+10*i))" --raft-addr "127.0.0.1:$((base+10*i+1))" \
      --initial-cluster "$initial" --log-level warn 2>>"$dir/serve.log" &
    pids+=($!)
  done
  eps="http://127.0.0.1:$base,http://127.0.0.1:$((base+10)),http://127.0.0.1:$((base+20))"
  for _ in $(seq 300); do
    ok=0
    for i in 0 1 2; do curl -sf "http://127.0.0.1:$((base+10*i))/readyz" >/dev/null && ok=$((ok+1)); done
    [ $ok = 3 ] && break
    sleep 0.1
  done
  sleep 8 # the balancer spreads the shard leaders (one transfer per shard)
  leaders=$(curl -s "http://127.0.0.1:$base/api/v1/cluster" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(s["leader_id"] for s in d.get("shards",[])) or d["leader_id"])')
  for workload in uncontended session; do
    out=$("$bin" bench --endpoints "$eps" --workload "$workload" --workers "$workers" --duration "$duration" --spread-names -q -o json)
    python3 -c '
import json, sys
d = json.loads(sys.argv[1])
cpu = " ".join("%s=%d" % (c["process"], round(c["cpu_us_per_op"])) for c in d.get("cpu", []))
print("shards=%s workload=%s leaders=[%s] cycles/s=%d p50=%.1fms p99=%.1fms cpu_us_per_cycle: %s" % (sys.argv[2], sys.argv[3], sys.argv[4],
      round(d["throughput"]), d["ops"]["cycle"]["p50_ms"], d["ops"]["cycle"]["p99_ms"], cpu))
' "$out" "$shards" "$workload" "$leaders"
  done
  cleanup
  rm -rf "$dir"
done
