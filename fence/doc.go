// Package fence is what a resource protected by dlock uses to refuse writes
// from holders that have lost their lock.
//
// A lock alone cannot protect a resource: a holder can pause (a GC stop, a
// swapped-out VM, a slow network) for longer than its lease, the cluster gives
// the lock to someone else, and then the first holder wakes up and writes,
// still believing it holds the lock. Every grant therefore carries a fencing
// token that only ever grows, and the resource itself remembers the highest
// token it has accepted per key and refuses anything lower. The check must
// happen at the resource, atomically with the write, because only the
// resource sees the order in which writes actually arrive.
//
// Checker keeps that highest token (and who wrote with it) per key in a bbolt
// file, so a restart never forgets it. A write with the same token as the
// highest is accepted only from the same holder: that is the same grant
// writing again (a second write in one critical section, or a retry after a
// lost reply). The same token from another holder is refused with
// ErrStaleToken, since a correct cluster never gives one token to two holders.
//
// Tokens are sequential, so anyone can guess a high one. Token proofs close
// that hole: the cluster signs every grant with Ed25519 (ProofMessage,
// SignProof), and a resource verifies the proof offline with the cluster's
// public keys (KeySet, FetchKeySet) before it lets the token near the Checker.
//
// This package imports only the standard library and bbolt, so resource
// servers can use it without pulling in the lock service.
package fence
