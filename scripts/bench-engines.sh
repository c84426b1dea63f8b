#!/usr/bin/env bash
# bench-engines.sh — dlock's two replication engines side by side (issue 26).
#
# Starts two 3-node `dlock serve` clusters on 127.0.0.1, one on each engine
# (--raft-engine hashicorp and etcd, fsync on in both), and runs the same
# `dlock bench` rows through each, BENCH_REPEAT times, alternating which
# engine goes first on every run so machine noise hits both; it prints the
# median of each row per engine and their ratio (etcd / hashicorp). The
# ratios are what to read on a shared, loaded machine. Everything it starts
# is stopped on exit.
#
#   scripts/bench-engines.sh
#   BENCH_REPEAT=5 BENCH_DURATION=5s BENCH_ROWS="uncontended:1 contended:8 contended:64 uncontended:64" scripts/bench-engines.sh
#   BENCH_ROWS="watch:64" BENCH_FAILOVER_REPEAT=50 scripts/bench-engines.sh
#
# Knobs: BENCH_REPEAT (3), BENCH_DURATION (4s), BENCH_WARMUP (1s), BENCH_ROWS
# (workload:workers; default: uncontended:1 contended:8 contended:64
# uncontended:64 ttl-per-acquire:64; "ttl-per-acquire" is the uncontended
# workload with a TTL on every acquire, "watch" reports the slowest node's
# event delivery p99 — with 64 workers both cores are saturated),
# BENCH_FAILOVER_REPEAT (0: off; else that many leader kills per engine on
# `dlock bench --workload failover`'s own 3-node clusters), BENCH_KEEP=1
# keeps the work dir (JSON results, logs), BENCH_PPROF=1 serves /debug/pprof
# on every node and saves a CPU profile of each leader during the
# contended:64 row.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPEAT=${BENCH_REPEAT:-3}
DUR=${BENCH_DURATION:-4s}
WARM=${BENCH_WARMUP:-1s}
ROWS=${BENCH_ROWS:-"uncontended:1 contended:8 contended:64 uncontended:64 ttl-per-acquire:64"}
FAILOVER_REPEAT=${BENCH_FAILOVER_REPEAT:-0}
. "$ROOT/scripts/lib/bench-common.sh"
bench_setup bench-engines
RES=$WORK/results
mkdir -p "$RES"
command -v jq >/dev/null || { echo "bench-engines: needs jq" >&2; exit 2; }

(cd "$ROOT" && go build -o "$WORK/bin/dlock" ./cmd/dlock)
BIN=$WORK/bin/dlock

read -r EPH_LO _ </proc/sys/net/ipv4/ip_local_port_range
PORT_HI=$((EPH_LO > 12000 ? EPH_LO - 200 : 30000))
port_used() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_base() {
	local base ok
	for _ in $(seq 100); do
		base=$((10000 + RANDOM % (PORT_HI - 10000)))
		ok=1
		for off in $(seq 0 60); do
			if port_used $((base + off)); then ok=0; break; fi
		done
		[ "$ok" = 1 ] && { echo "$base"; return; }
	done
	echo "no free port range" >&2
	return 1
}
BASE=$(pick_base)

declare -A EPS
start_cluster() { # engine offset
	local engine=$1 off=$2 cluster="" eps="" i ap rp
	for i in 0 1 2; do
		cluster+="${cluster:+,}n$((i + 1))=127.0.0.1:$((BASE + off + 10 * i + 1))"
		eps+="${eps:+,}http://127.0.0.1:$((BASE + off + 10 * i))"
	done
	EPS[$engine]=$eps
	log "starting the $engine cluster: $eps"
	for i in 0 1 2; do
		ap=$((BASE + off + 10 * i)); rp=$((BASE + off + 10 * i + 1))
		"$BIN" serve --id "n$((i + 1))" --data-dir "$WORK/$engine/n$((i + 1))" --raft-engine "$engine" \
			--api-addr "127.0.0.1:$ap" --raft-addr "127.0.0.1:$rp" \
			$([ "${BENCH_PPROF:-0}" = 1 ] && echo --enable-pprof) \
			--initial-cluster "$cluster" --log-level warn >"$WORK/$engine-n$((i + 1)).log" 2>&1 &
		PIDS+=($!)
	done
}
start_cluster hashicorp 0
start_cluster etcd 30
for engine in hashicorp etcd; do
	for _ in $(seq 120); do
		"$BIN" bench -q --endpoints "${EPS[$engine]}" --workload uncontended --workers 4 --duration 1s --warmup 0s >/dev/null 2>&1 && break
		sleep 0.5
	done
done
log "both clusters answer"
{
	echo "date=$(date -u +%Y-%m-%dT%H:%MZ) cpu=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
	echo "dlock=$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown) repeat=$REPEAT duration=$DUR warmup=$WARM"
} | tee "$WORK/machine.env" >&2

leader_api() { # engine: the leader's API address
	local ep
	for ep in ${EPS[$1]//,/ }; do
		curl -fsS "$ep/api/v1/cluster" 2>/dev/null | jq -r '.leader_api_addr // empty' && return
	done
}

run() { # engine workload workers rep
	local engine=$1 wl=$2 w=$3 rep=$4
	local out="$RES/$1-$2-$3-$4.json" prof=""
	if [ "${BENCH_PPROF:-0}" = 1 ] && [ "$wl:$w" = contended:64 ]; then
		local la
		la=$(leader_api "$engine" || true)
		if [ -n "$la" ]; then
			curl -fsS -o "$RES/$engine-leader-cpu-$rep.pprof" "http://$la/debug/pprof/profile?seconds=3" &
			prof=$!
		fi
	fi
	local bwl=$wl extra=()
	case $wl in ttl-per-acquire) bwl=uncontended; extra=(--ttl-per-acquire) ;; esac
	if ! "$BIN" bench -q -o json --endpoints "${EPS[$engine]}" --workload "$bwl" --workers "$w" "${extra[@]}" \
		--duration "$DUR" --warmup "$WARM" --label "$engine" >"$out" 2>"$out.err"; then
		log "FAILED: $engine $wl $w: $(tail -3 "$out.err")"
		rm -f "$out"
		return 0
	fi
	[ -n "$prof" ] && { wait "$prof" 2>/dev/null || true; }
	log "$(printf '%-9s %-15s %3d workers run %d: ' "$engine" "$wl" "$w" "$rep")$(jq -r '"\(.throughput|floor) \(.throughput_unit)/s, acquire p50 \(.ops.acquire.p50_ms) ms p99 \(.ops.acquire.p99_ms) ms\(if .ops["delivery (all nodes)"] then ", watch delivery p99 \(.ops["delivery (all nodes)"].p99_ms) ms" else "" end)"' "$out")"
}

for rep in $(seq "$REPEAT"); do
	for row in $ROWS; do
		wl=${row%%:*}; w=${row##*:}
		if [ $((rep % 2)) = 1 ]; then run hashicorp "$wl" "$w" "$rep"; run etcd "$wl" "$w" "$rep"
		else run etcd "$wl" "$w" "$rep"; run hashicorp "$wl" "$w" "$rep"; fi
	done
done

failover() { # engine rep
	local out="$RES/failover-$1-$2.json"
	if ! "$BIN" bench -q -o json --workload failover --nodes 3 --repeat "$FAILOVER_REPEAT" \
		--serve-flags "--raft-engine $1" --label "$1" >"$out" 2>"$out.err"; then
		log "FAILED: failover $1: $(tail -3 "$out.err")"
		rm -f "$out"
		return 0
	fi
	log "$(printf 'failover %-9s run %d: ' "$1" "$2")$(jq -r '"p50 \(.ops.failover.p50_ms) ms p99 \(.ops.failover.p99_ms) ms max \(.ops.failover.max_ms) ms"' "$out")"
}
if [ "$FAILOVER_REPEAT" != 0 ]; then
	# Its own clusters: stop the shared ones so they do not compete (KILL
	# after 10 s: a hashicorp node's graceful shutdown has been seen to hang
	# on a replication goroutine stuck in its pipeline).
	bench_stop
	failover hashicorp 1; failover etcd 1
fi

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"} else if (NR%2) {print a[(NR+1)/2]} else {print (a[NR/2]+a[NR/2+1])/2}}'; }
printf '\n| row | hashicorp: ops/s, p50 ms | etcd: ops/s, p50 ms | etcd/hashicorp ops/s | etcd/hashicorp p50 |\n|---|---|---|---|---|\n'
WATCH_ROWS=
for row in $ROWS; do
	wl=${row%%:*}; w=${row##*:}
	declare -A T P
	for engine in hashicorp etcd; do
		T[$engine]=$(cat "$RES/$engine-$wl-$w-"*.json 2>/dev/null | jq -r '.throughput' | median)
		P[$engine]=$(cat "$RES/$engine-$wl-$w-"*.json 2>/dev/null | jq -r '.ops.acquire.p50_ms' | median)
	done
	printf '| %s, %s workers | %.0f, %.3f | %.0f, %.3f | %.2f | %.2f |\n' "$wl" "$w" \
		"${T[hashicorp]}" "${P[hashicorp]}" "${T[etcd]}" "${P[etcd]}" \
		"$(echo "${T[etcd]} / ${T[hashicorp]}" | bc -l)" "$(echo "${P[etcd]} / ${P[hashicorp]}" | bc -l)"
	if [ "$wl" = watch ]; then WATCH_ROWS+=" $row"; fi
done
for row in $WATCH_ROWS; do
	wl=${row%%:*}; w=${row##*:}
	printf '| watch delivery p99 (slowest node), %s workers | hashicorp %s ms | etcd %s ms |\n' "$w" \
		"$(cat "$RES/hashicorp-$wl-$w-"*.json 2>/dev/null | jq -r '.ops["delivery (all nodes)"].p99_ms' | median)" \
		"$(cat "$RES/etcd-$wl-$w-"*.json 2>/dev/null | jq -r '.ops["delivery (all nodes)"].p99_ms' | median)"
done
if [ "$FAILOVER_REPEAT" != 0 ]; then
	for engine in hashicorp etcd; do
		printf '| failover, %s kills | %s | %s |\n' "$FAILOVER_REPEAT" "$engine" \
			"$(jq -r '"p50 \(.ops.failover.p50_ms) ms, p99 \(.ops.failover.p99_ms) ms, max \(.ops.failover.max_ms) ms"' "$RES/failover-$engine-1.json" 2>/dev/null || echo failed)"
	done
fi
machine=$(tr '\n' ' ' <"$WORK/machine.env")
echo "medians of $REPEAT runs of $DUR each; $machine"
if [ "${BENCH_PPROF:-0}" = 1 ]; then
	mkdir -p "${BENCH_PPROF_DIR:-$WORK/pprof}"
	cp "$RES"/*.pprof "${BENCH_PPROF_DIR:-$WORK/pprof}/" 2>/dev/null || true
	echo "profiles: ${BENCH_PPROF_DIR:-$WORK/pprof}"
fi
