#!/usr/bin/env bash
# Renewal throughput of a million held locks with the grant history empty vs
# full, measured as a ratio in one run (docs/benchmarks.md, "Grant history:
# renewal throughput").
#
# Two fresh 3-node `dlock serve` clusters of real processes run side by side
# (GOMEMLIMIT=900MiB, the setting docs/operations.md gives for a million
# locks): "empty" as it starts, "full" after BENCH_FILL_KEYS locks were taken
# and released, which fills the history past its default 64 MiB budget. Each
# then holds BENCH_KEYS locks (a `dlock bench --workload held` per cluster,
# 256 workers, 600 s leases). Once both hold them, their renewal windows take
# turns (through --held-gate) — empty, full, full, empty, empty, full, … — so
# both see the same machine, and the medians of BENCH_ROUNDS windows of
# BENCH_WINDOW each are compared. The machine may be shared: only the ratio
# means much. The setup must take less than the held leases' 600 s (the
# longest TTL) — about 1,700 acquires/s for a million — or the first locks
# expire before they are renewed; the summary says so when it did not.
#
# Usage: scripts/bench-history-renewals.sh   (env: BENCH_KEYS 1000000,
#        BENCH_FILL_KEYS 300000, BENCH_ROUNDS 5, BENCH_WINDOW 10s,
#        BENCH_GOMEMLIMIT 900MiB; BENCH_KEEP=1 keeps the work dir)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KEYS=${BENCH_KEYS:-1000000}
FILL_KEYS=${BENCH_FILL_KEYS:-300000}
ROUNDS=${BENCH_ROUNDS:-5}
WINDOW=${BENCH_WINDOW:-10s}
MEMLIMIT=${BENCH_GOMEMLIMIT-900MiB}
. "$ROOT/scripts/lib/bench-common.sh"
bench_setup bench-history-renewals

log "building dlock"
(cd "$ROOT" && go build -o "$WORK/dlock" ./cmd/dlock)
BIN=$WORK/dlock

read -r EPH_LO _ </proc/sys/net/ipv4/ip_local_port_range
PORT_HI=$((EPH_LO > 12000 ? EPH_LO - 200 : 30000))
port_used() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_base() { # six API/Raft port pairs, 10 apart, none in use
	local base off
	for _ in $(seq 100); do
		base=$((10000 + RANDOM % (PORT_HI - 10100)))
		for off in 0 1 10 11 20 21 30 31 40 41 50 51; do
			port_used $((base + off)) && continue 2
		done
		echo "$base"
		return
	done
	echo "no free port range" >&2
	return 1
}
BASE=$(pick_base)

wait_ok() { # url
	for _ in $(seq 300); do
		curl -fsS -m 1 "$1" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "bench-history-renewals: not ready: $1" >&2
	return 1
}

declare -A EPS
start_cluster() { # name base
	local name=$1 base=$2 i cluster="" eps=""
	for i in 0 1 2; do
		cluster+="${cluster:+,}n$((i + 1))=127.0.0.1:$((base + 10 * i + 1))"
		eps+="${eps:+,}http://127.0.0.1:$((base + 10 * i))"
	done
	for i in 0 1 2; do
		env ${MEMLIMIT:+GOMEMLIMIT=$MEMLIMIT} "$BIN" serve --id "n$((i + 1))" --data-dir "$WORK/$name/n$((i + 1))" \
			--api-addr "127.0.0.1:$((base + 10 * i))" --raft-addr "127.0.0.1:$((base + 10 * i + 1))" \
			--initial-cluster "$cluster" --log-level warn >"$WORK/$name-n$((i + 1)).log" 2>&1 &
		PIDS+=($!)
	done
	for i in 0 1 2; do wait_ok "http://127.0.0.1:$((base + 10 * i))/readyz"; done
	EPS[$name]=$eps
	log "cluster $name: $eps"
}
start_cluster empty "$BASE"
start_cluster full $((BASE + 30))

log "full: filling the history ($FILL_KEYS locks taken and released)"
"$BIN" bench -q -o json --endpoints "${EPS[full]}" --workload held --workers 256 --keys "$FILL_KEYS" \
	--held-ttl 600s --held-release=true --duration 1s --warmup 0s --label history-fill >"$WORK/fill.json"

BENCH_PIDS=()
for name in empty full; do
	mkdir -p "$WORK/gate-$name"
	"$BIN" bench -o json --endpoints "${EPS[$name]}" --workload held --workers 256 --keys "$KEYS" \
		--held-ttl 600s --held-release=false --duration "$WINDOW" --warmup 0s \
		--held-rounds "$ROUNDS" --held-gate "$WORK/gate-$name" --label "history-$name" \
		>"$WORK/$name.json" 2>"$WORK/$name.err" &
	PIDS+=($!)
	BENCH_PIDS+=($!)
done
await() { # name file pid: wait for the gate file while that bench still runs
	while [ ! -e "$2" ]; do
		if ! kill -0 "$3" 2>/dev/null; then
			echo "bench-history-renewals: the $1 bench ended before $2:" >&2
			tail -5 "$WORK/$1.err" >&2 || true
			return 1
		fi
		sleep 0.2
	done
}
log "both clusters: taking $KEYS locks each (the long part)"
await empty "$WORK/gate-empty/ready" "${BENCH_PIDS[0]}"
await full "$WORK/gate-full/ready" "${BENCH_PIDS[1]}"
log "both hold $KEYS locks; renewal windows take turns"
for r in $(seq "$ROUNDS"); do
	order="empty full"
	[ $((r % 2)) = 0 ] && order="full empty"
	for name in $order; do
		pid=${BENCH_PIDS[0]}
		[ "$name" = full ] && pid=${BENCH_PIDS[1]}
		touch "$WORK/gate-$name/round-$r"
		await "$name" "$WORK/gate-$name/round-$r.done" "$pid"
		log "round $r $name: $(grep -o "round $r of $ROUNDS: [0-9]* renewals/s" "$WORK/$name.err" | tail -1)"
	done
done
wait "${BENCH_PIDS[@]}"

python3 - "$WORK/empty.json" "$WORK/full.json" "$WORK/fill.json" <<'EOF'
import json, statistics, sys
empty, full, fill = (json.load(open(p)) for p in sys.argv[1:4])
me, mf = statistics.median(empty["rounds_per_sec"]), statistics.median(full["rounds_per_sec"])
def rss(r):
    return ", ".join(f'{m["node"]} {m["rss_mib"]:.0f}' for m in r["memory"] if m["phase"] == "renewing")
print(f'history filled by {fill["config"].get("keys", "?")} locks taken and released')
for name, r, m in (("empty", empty, me), ("full", full, mf)):
    print(f'{name:5}: setup {r["ops"]["acquire (setup)"]["per_sec"]:.0f} acquires/s; renewals/s per window '
          f'{[round(x) for x in r["rounds_per_sec"]]}, median {m:.0f}; RSS MiB while renewing: {rss(r)}')
print(f'ratio full/empty (medians): {mf / me:.3f}')
for name, r in (("empty", empty), ("full", full)):
    secs = int(r["config"]["keys"]) / r["ops"]["acquire (setup)"]["per_sec"]
    errs = r.get("errors") or {}
    if secs > 600 or errs:
        print(f'WARNING: {name}: setup took {secs:.0f} s (the held leases last 600 s) or errors {errs}: not a valid run')
EOF
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
