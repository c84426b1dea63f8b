// Package chaos is dlock's fault-injection (Jepsen-style) suite: it runs real
// `dlock serve` processes on loopback, routes every node-to-node connection
// through an in-test TCP proxy that can cut any directed link, drives a
// workload of lock clients (over HTTP, gRPC and WebSocket) that write to
// fenced registers while watchers follow every change, injects faults (kill
// -9, SIGSTOP, partitions, client pauses, whole-cluster restarts, follower
// and leader replacement, leadership transfer; on sharded clusters also splits of busy
// ranges and moves of a shard's replica to another node) from a printed
// seed, and checks the
// recorded history: linearizability (porcupine), mutual exclusion by the
// clients' conservative lease bounds, fencing-token order, durability of
// acknowledged operations, agreeing watch streams, election observers that
// miss no leader, FIFO order of waiters and liveness after healing.
//
// The package has only tests. The long runs are opt-in:
//
//	DLOCK_CHAOS=1 go test -race=false -run TestChaosCI -timeout 10m ./test/chaos/
//	scripts/chaos.sh --duration 30m --seed 42
//	scripts/chaos.sh --duration 30m --nodes 4 --shards 4 --shard-replicas 3
//
// Without DLOCK_CHAOS=1 only the fast unit tests of the checkers and the proxy
// run. See docs/reliability.md.
package chaos
