#!/usr/bin/env bash
# Long fault-injection soak of dlock (see docs/reliability.md).
#
#   scripts/chaos.sh [--duration 30m] [--seed S] [--nodes 3] [--clients 6]
#                    [--log-store wal|bolt] [--raft-engine hashicorp|etcd] [--bin PATH] [--keep]
#                    [--pace dense|normal] [--forensic] [--shards N] [--shard-replicas R] [--spare]
#
# Runs real `dlock serve` processes behind link proxies, injects faults from
# the seed for the given duration, then heals, checks the history and prints
# the report (seed, operations, faults by kind, anomalies, recovery times).
# A failing run keeps its artifacts (node logs, data dirs, history.jsonl,
# porcupine visualizations) and prints where they are. Replay a failure with
# the same --seed (the schedule of decisions is the same; timings differ).
# --pace dense (the default here) injects about 3,000 faults per 30 minutes,
# normal (CI's pace) about 1,100. --forensic keeps every Raft log entry and
# every snapshot on the nodes, so a failure can be replayed entry by entry
# (docs/reliability.md, "Finding a divergence"). --shards N runs every node
# with --shards N on the etcd engine, names in every shard's range and the
# checks per shard (docs/reliability.md, "Sharded clusters"). --shard-replicas R
# (below --nodes) runs each shard on R of the nodes and adds replica moves to
# the faults, e.g. --nodes 4 --shards 4 --shard-replicas 3. --spare (with
# --shard-replicas) adds a node beyond --nodes that joins, takes replicas,
# gives them up and is removed, over and over, among the faults.
# Environment variables DLOCK_CHAOS_DURATION / DLOCK_CHAOS_SEED /
# DLOCK_CHAOS_SHARDS / DLOCK_CHAOS_SHARD_REPLICAS / DLOCK_CHAOS_SPARE=1 work too.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi

duration=${DLOCK_CHAOS_DURATION:-30m}
export DLOCK_CHAOS_PACE=${DLOCK_CHAOS_PACE:-dense}
seed=${DLOCK_CHAOS_SEED:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=$2; shift 2 ;;
    --duration=*) duration=${1#*=}; shift ;;
    --seed) seed=$2; shift 2 ;;
    --seed=*) seed=${1#*=}; shift ;;
    --nodes) export DLOCK_CHAOS_NODES=$2; shift 2 ;;
    --clients) export DLOCK_CHAOS_CLIENTS=$2; shift 2 ;;
    --log-store) export DLOCK_CHAOS_LOG_STORE=$2; shift 2 ;;
    --raft-engine) export DLOCK_TEST_RAFT_ENGINE=$2; shift 2 ;;
    --bin) export DLOCK_CHAOS_BIN=$2; shift 2 ;;
    --keep) export DLOCK_CHAOS_KEEP=1; shift ;;
    --pace) export DLOCK_CHAOS_PACE=$2; shift 2 ;;
    --shards) export DLOCK_CHAOS_SHARDS=$2; shift 2 ;;
    --shards=*) export DLOCK_CHAOS_SHARDS=${1#*=}; shift ;;
    --shard-replicas) export DLOCK_CHAOS_SHARD_REPLICAS=$2; shift 2 ;;
    --shard-replicas=*) export DLOCK_CHAOS_SHARD_REPLICAS=${1#*=}; shift ;;
    --spare) export DLOCK_CHAOS_SPARE=1; shift ;;
    --forensic) export DLOCK_CHAOS_SERVE_ARGS="${DLOCK_CHAOS_SERVE_ARGS:-} --trailing-logs 1000000000 --snapshot-retain 100000"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
if [ "${DLOCK_CHAOS_SHARDS:-1}" -gt 1 ] 2>/dev/null; then
  if [ -n "${DLOCK_TEST_RAFT_ENGINE:-}" ] && [ "$DLOCK_TEST_RAFT_ENGINE" != etcd ]; then
    echo "chaos.sh: --shards needs the etcd engine (--raft-engine etcd), not $DLOCK_TEST_RAFT_ENGINE" >&2
    exit 2
  fi
  export DLOCK_TEST_RAFT_ENGINE=etcd
fi
if [ -z "$seed" ]; then
  seed=$(( $(date +%s%N) % 1000000000 ))
fi

# go test's -timeout: the run, plus the final checks, plus a margin.
secs=0
rest=$duration
while [ -n "$rest" ]; do
  if [[ $rest =~ ^([0-9]+)(h|m|s)(.*)$ ]]; then
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in h) n=$((n * 3600)) ;; m) n=$((n * 60)) ;; esac
    secs=$((secs + n))
    rest=${BASH_REMATCH[3]}
  else
    echo "chaos.sh: --duration $duration: use forms like 30m, 1h, 90s, 1h30m" >&2
    exit 2
  fi
done
timeout=$(( secs + 900 ))s

echo "chaos soak: seed=$seed duration=$duration pace=$DLOCK_CHAOS_PACE shards=${DLOCK_CHAOS_SHARDS:-1}${DLOCK_CHAOS_SHARD_REPLICAS:+ shard-replicas=$DLOCK_CHAOS_SHARD_REPLICAS}${DLOCK_CHAOS_SPARE:+ spare}${DLOCK_CHAOS_SERVE_ARGS:+ serve-args:$DLOCK_CHAOS_SERVE_ARGS} (go test -timeout $timeout)"
export DLOCK_CHAOS=1 DLOCK_CHAOS_SOAK=1 DLOCK_CHAOS_SEED="$seed" DLOCK_CHAOS_DURATION="$duration"
exec go test -race=false -count=1 -v -timeout "$timeout" -run '^TestChaosSoak$' ./test/chaos/
