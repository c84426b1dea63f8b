package client

import "time"

// Holder is the public view of who holds a lock.
type Holder struct {
	ClientID     string    `json:"client_id"`
	FencingToken uint64    `json:"fencing_token"`
	GrantedAt    time.Time `json:"granted_at,omitzero"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	// Mode is the grant's mode, ModeExclusive or ModeShared.
	Mode string `json:"mode,omitempty"`
	// Subtree: the grant covers the names below its lock.
	Subtree bool `json:"subtree,omitempty"`
	// Lock, in a refusal, is the lock the holder's grant is on when that
	// is another one than asked for: a subtree lock above the name, or a
	// lock inside the subtree asked for.
	Lock string `json:"lock,omitempty"`
}

// Lock modes (Holder.Mode, LockStatus.Mode).
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// LockStatus is the state of one lock as GET /locks/{name} shows it.
type LockStatus struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// Holder is the first holder in grant order (a Mutex's only one).
	Holder  *Holder `json:"holder,omitempty"`
	Waiters int     `json:"waiters"`
	// Limit is the lock's limit (1: a mutex); Mode the holders' mode while
	// held; Subtree says a holder's grant covers the names below.
	Limit   int    `json:"limit"`
	Mode    string `json:"mode,omitempty"`
	Subtree bool   `json:"subtree,omitempty"`
	// Holders are every holder, in grant order.
	Holders  []Holder `json:"holders"`
	Revision uint64   `json:"revision"`
	// Value is the holder's value (WithValue, Lease.SetValue).
	Value string `json:"value,omitempty"`
	// DelayedUntil is set while a lock-delay keeps the lock from everyone
	// (WithLockDelay).
	DelayedUntil time.Time `json:"delayed_until,omitzero"`
}

// GrantRecord is one grant in a lock's history. EndedAt and EndCause are
// empty for a grant that holds the lock now.
type GrantRecord struct {
	FencingToken uint64    `json:"fencing_token"`
	ClientID     string    `json:"client_id"`
	Value        string    `json:"value,omitempty"`
	GrantedAt    time.Time `json:"granted_at"`
	EndedAt      time.Time `json:"ended_at,omitzero"`
	// EndCause is "released", "expired", "session_deleted", "revoked",
	// "taken_over" or "resigned"; "" while the grant holds.
	EndCause    string `json:"end_cause,omitempty"`
	Reason      string `json:"reason,omitempty"` // a revoke's
	TTLms       int64  `json:"ttl_ms"`
	LockDelayMs int64  `json:"lock_delay_ms,omitempty"`
}

// History is a lock's (or an election's) recent grants, newest first.
type History struct {
	Name     string        `json:"name"`
	Grants   []GrantRecord `json:"grants"`
	Revision uint64        `json:"revision"`
}

// Member is one node of the cluster.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	// Version is the build the member runs, as it registered it.
	Version  string `json:"version"`
	Suffrage string `json:"suffrage"`
	State    string `json:"state"`
	// Filled by ClusterHealth only: a probe of the member by the answering node.
	Reachable     bool    `json:"reachable"`
	AppliedIndex  uint64  `json:"applied_index"`
	LastContactMs float64 `json:"last_contact_ms"`
	// Removing is true while a sharded cluster's shard map lists the node as
	// being removed: its removal began and has not finished.
	Removing bool `json:"removing,omitempty"`
}

// ClusterInfo is one node's view of the cluster (GET /cluster); it is not a
// linearizable read.
type ClusterInfo struct {
	NodeID           string   `json:"node_id"`
	LeaderID         string   `json:"leader_id"`
	LeaderAPIAddr    string   `json:"leader_api_addr,omitempty"`
	Term             uint64   `json:"term"`
	Members          []Member `json:"members"`
	CommitIndex      uint64   `json:"commit_index"`
	AppliedIndex     uint64   `json:"applied_index"`
	Revision         uint64   `json:"revision"`
	LastFencingToken uint64   `json:"last_fencing_token"`
	// Shards is set by a sharded cluster: each shard's key range, leader,
	// term and indexes as the answering node sees them (the fields above
	// are then shard 0's).
	Shards []ShardInfo `json:"shards,omitempty"`
	// ShardGeneration is a sharded cluster's map generation (1 as created,
	// one more per split) as the answering node routes by it.
	ShardGeneration uint64 `json:"shard_generation,omitempty"`
}

// ShardInfo is one shard of a sharded cluster: the names whose first
// segment is in [Start, End) (End "" is open), and its Raft group.
type ShardInfo struct {
	ID               int    `json:"id"`
	Start            string `json:"start"`
	End              string `json:"end"`
	LeaderID         string `json:"leader_id"`
	LeaderAPIAddr    string `json:"leader_api_addr,omitempty"`
	Term             uint64 `json:"term"`
	CommitIndex      uint64 `json:"commit_index"`
	AppliedIndex     uint64 `json:"applied_index"`
	Revision         uint64 `json:"revision"`
	LastFencingToken uint64 `json:"last_fencing_token"`
	// Replicas are the ids of the nodes that run the shard; Leaving is the
	// one a replica move in flight is taking off it.
	Replicas []string `json:"replicas,omitempty"`
	Leaving  string   `json:"leaving,omitempty"`
}

// Grant is a successful low-level Acquire. Nothing renews it: renew it with
// Client.Renew before ExpiresAt or lose it.
type Grant struct {
	Name         string `json:"name"`
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	// LeaseID is the holder's secret proof, with FencingToken, for Renew and
	// Release. Do not log it or show it to anyone else.
	LeaseID string `json:"lease_id"`
	// ExpiresAt is the server's expiry, in the leader's wall clock (for
	// display; the server decides expiry on its monotonic clock).
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	Revision  uint64    `json:"revision"`
	// TokenProof is the cluster's signature of this grant. Send it with the
	// fencing token to a resource that checks tokens with the fence package,
	// which refuses forged tokens with it (docs/fencing.md).
	TokenProof string `json:"token_proof,omitempty"`
	// LeaseRef is a one-way reference to LeaseID that the proof binds: send
	// it, never the lease id, to a fenced resource.
	LeaseRef string `json:"lease_ref,omitempty"`
}

// The request and answer bodies of the HTTP API (docs/api.md). The client
// has its own copies so that it never depends on server internals.

type acquireRequest struct {
	ClientID      string `json:"client_id"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id,omitempty"`
	Takeover      bool   `json:"takeover,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	Mode          string `json:"mode,omitempty"`
	Subtree       bool   `json:"subtree,omitempty"`
	Value         string `json:"value,omitempty"`
	LockDelayMs   int64  `json:"lock_delay_ms,omitempty"`
}

type acquireResponse struct {
	Acquired     bool      `json:"acquired"`
	FencingToken uint64    `json:"fencing_token"`
	TokenProof   string    `json:"token_proof"`
	LeaseRef     string    `json:"lease_ref"`
	ExpiresAt    time.Time `json:"expires_at"`
	LeaseID      string    `json:"lease_id"`
	Revision     uint64    `json:"revision"`
}

type holderRequest struct {
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	TTLms        int64  `json:"ttl_ms,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
	// Value, when set, replaces the holder's value (renew only).
	Value *string `json:"value,omitempty"`
}

type revokeRequest struct {
	FencingToken uint64 `json:"fencing_token,omitempty"`
	Reason       string `json:"reason"`
	ClientID     string `json:"client_id,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
}

type revokeResponse struct {
	Revoked       bool     `json:"revoked"`
	FencingToken  uint64   `json:"fencing_token"`
	FencingTokens []uint64 `json:"fencing_tokens"`
}

type renewResponse struct {
	Renewed   bool      `json:"renewed"`
	ExpiresAt time.Time `json:"expires_at"`
}

type listResponse struct {
	Locks     []LockStatus   `json:"locks"`
	More      bool           `json:"more"`
	Revision  uint64         `json:"revision"`
	Revisions map[int]uint64 `json:"revisions"`
}

type sessionRequest struct {
	ClientID  string `json:"client_id"`
	TTLms     int64  `json:"ttl_ms,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

type sessionResponse struct {
	SessionID string    `json:"session_id"`
	TTLms     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
}

type keepAliveRequest struct {
	ClientID  string `json:"client_id"`
	RequestID string `json:"request_id,omitempty"`
	LostAfter uint64 `json:"lost_after,omitempty"`
}

// keepAliveResponse is a keepalive's answer; a server that predates lost
// grants sends no lost.
type keepAliveResponse struct {
	Revision uint64      `json:"revision"`
	Lost     []lostGrant `json:"lost"`
}

// lostGrant is a grant the session lost while it lived (docs/api.md).
type lostGrant struct {
	Kind         string `json:"kind"`
	Name         string `json:"name"`
	FencingToken uint64 `json:"fencing_token"`
	Cause        string `json:"cause"`
	Reason       string `json:"reason"`
	Revision     uint64 `json:"revision"`
}

// errorResponse covers both error shapes: the plain {"error":…} and an
// acquire conflict, which adds the holder.
type errorResponse struct {
	Error *struct {
		Code         string `json:"code"`
		Message      string `json:"message"`
		RetryAfterMs int64  `json:"retry_after_ms"`
	} `json:"error"`
	Holder       *Holder `json:"holder"`
	Limit        int     `json:"limit"`
	FencingToken uint64  `json:"fencing_token"`
}
