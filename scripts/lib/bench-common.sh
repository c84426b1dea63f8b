# shellcheck shell=bash
# What every benchmark script shares: its work dir ($WORK, kept when it fails
# or with BENCH_KEEP=1), the processes it started ($PIDS, stopped on exit:
# TERM, then KILL after 10 s) and log(). Source it, then call
# bench_setup NAME.

bench_setup() {
	BENCH_NAME=$1
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/dlock-$1.XXXXXX")
	T_START=$(date +%s)
	PIDS=()
	trap bench_cleanup EXIT
	trap 'exit 130' INT TERM
}

# bench_stop stops every process in $PIDS (TERM, then KILL after 10 s) and
# empties it.
bench_stop() {
	local pid alive
	for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for _ in $(seq 50); do
		alive=0
		for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ "$alive" = 0 ] && break
		sleep 0.2
	done
	for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	PIDS=()
	return 0
}

bench_cleanup() {
	local rc=$?
	set +e
	bench_stop
	if [ "${BENCH_KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
		echo "$BENCH_NAME: work dir kept: $WORK" >&2
	else
		rm -rf "$WORK"
	fi
	exit "$rc"
}

log() { printf '%s [%4ds] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - T_START))" "$*" >&2; }
