package service

import (
	"time"

	"github.com/dlock/dlock/internal/command"
)

// AcquireRequest asks for a lock. Exactly one of TTLms (an implicit one-lock
// lease) or SessionID (hold it under an existing session) is set. WaitTimeoutMs
// > 0 waits in the lock's FIFO queue for at most that long.
type AcquireRequest struct {
	Name          string `json:"-"`
	ClientID      string `json:"client_id"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id,omitempty"`
	// Takeover takes the lock (or a place in its queue) from another lease
	// of the same client_id at once; without it that lease is like any
	// other holder. Under ACLs it needs a token naming the client_id.
	Takeover bool `json:"takeover,omitempty"`
	// Limit (1-10,000; 0 means 1) makes a counting lock: up to Limit
	// exclusive holders at once. The acquire that finds the lock unused
	// sets it; any other must ask for the same (limit_mismatch).
	Limit int64 `json:"limit,omitempty"`
	// Mode is ModeExclusive (the default, "") or ModeShared.
	Mode string `json:"mode,omitempty"`
	// Subtree makes the grant cover the name and every name below it.
	Subtree bool `json:"subtree,omitempty"`
	// Value is the holder's value while it holds the lock (at most 4 KiB):
	// who holds it, where, doing what.
	Value string `json:"value,omitempty"`
	// LockDelayMs (0..60000) keeps the lock from everyone that long after
	// this grant ends by expiry or revoke (never after a release).
	LockDelayMs int64 `json:"lock_delay_ms,omitempty"`
}

// Lock modes.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// Holder is the public view of who holds a lock.
type Holder struct {
	ClientID     string    `json:"client_id"`
	FencingToken uint64    `json:"fencing_token"`
	GrantedAt    time.Time `json:"granted_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	// Mode is the grant's mode (ModeExclusive or ModeShared).
	Mode string `json:"mode,omitempty"`
	// Subtree: the grant covers the names below its lock.
	Subtree bool `json:"subtree,omitempty"`
	// Lock is the name of the lock the grant is on when a refusal names a
	// grant on another lock: a subtree grant above the name asked for, or
	// a grant inside the subtree asked for.
	Lock string `json:"lock,omitempty"`
}

// AcquireResponse answers an acquire. When Acquired is false the error returned
// alongside says why (lock_held or wait_timeout) and Holder says who has it.
type AcquireResponse struct {
	Acquired     bool   `json:"acquired"`
	FencingToken uint64 `json:"fencing_token,omitempty"`
	// TokenProof is the cluster's signature of this grant (see fence).
	TokenProof string `json:"token_proof,omitempty"`
	// LeaseRef is fence.LeaseRef(LeaseID): what a resource gets instead of
	// the lease id, which must stay with the holder.
	LeaseRef  string    `json:"lease_ref,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	LeaseID   string    `json:"lease_id,omitempty"`
	Revision  uint64    `json:"revision,omitempty"`
	Holder    *Holder   `json:"holder,omitempty"`
	// Limit is the lock's limit, with a limit_mismatch error.
	Limit int `json:"limit,omitempty"`
}

// ReleaseRequest gives a lock back. The token and lease id prove the caller is
// the holder.
type ReleaseRequest struct {
	Name         string `json:"-"`
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	RequestID    string `json:"request_id,omitempty"`
}

// ReleaseResponse answers a release.
type ReleaseResponse struct {
	Released bool   `json:"released"`
	Revision uint64 `json:"revision"`
}

// RenewRequest extends the lease holding a lock; TTLms 0 keeps its TTL.
type RenewRequest struct {
	Name         string `json:"-"`
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	TTLms        int64  `json:"ttl_ms,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
	// Value, when present, replaces the holder's value ("" clears it).
	Value *string `json:"value,omitempty"`
}

// RenewResponse answers a renewal.
type RenewResponse struct {
	Renewed   bool      `json:"renewed"`
	ExpiresAt time.Time `json:"expires_at"`
	TTLms     int64     `json:"ttl_ms"`
	Revision  uint64    `json:"revision"`
}

// LockView is the public state of one lock.
type LockView struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// Holder is the first holder in grant order (the only one of a mutex).
	Holder  *Holder `json:"holder,omitempty"`
	Waiters int     `json:"waiters"`
	// Limit is the lock's limit (1: a mutex); Mode its holders' mode, when
	// held; Subtree says some holder's grant covers the names below it.
	Limit   int    `json:"limit"`
	Mode    string `json:"mode,omitempty"`
	Subtree bool   `json:"subtree,omitempty"`
	// Holders are every holder, in grant order.
	Holders []Holder `json:"holders"`
	// Queue is the head of the wait queue in order (at most 100 waiters;
	// Waiters counts them all). Only a read of one lock fills it.
	Queue []Waiter `json:"queue,omitempty"`
	// Value is the holder's value.
	Value string `json:"value,omitempty"`
	// DelayedUntil is set while a lock-delay keeps the lock from everyone
	// (the leader's wall clock when it began, plus the delay).
	DelayedUntil time.Time `json:"delayed_until,omitzero"`
	Revision     uint64    `json:"revision"`
	// Stale is set on a ?stale=true answer; the APIs send it as headers.
	Stale *StaleRead `json:"-"`
}

// Waiter is one client waiting in a lock's queue.
type Waiter struct {
	ClientID   string    `json:"client_id"`
	EnqueuedAt time.Time `json:"enqueued_at"`
	// WaitDeadline is when its wait times out (leader's clock, for display).
	WaitDeadline time.Time `json:"wait_deadline,omitzero"`
}

// StaleRead says how fresh a ?stale=true answer, read from the answering
// node's own state, may be (Consul's X-Consul-KnownLeader and
// X-Consul-LastContact): a node cut off from the leader, or removed from the
// cluster, answers from a state that no longer moves.
type StaleRead struct {
	// KnownLeader: the node knew a leader when it answered.
	KnownLeader bool
	// LastContact is how long ago the node last heard from the leader: 0 on
	// the leader, -1 if it never has.
	LastContact time.Duration
}

// LastContactMs is LastContact in whole milliseconds, if the node ever heard
// from a leader.
func (sr *StaleRead) LastContactMs() (int64, bool) {
	return sr.LastContact.Milliseconds(), sr.LastContact >= 0
}

// ListRequest lists locks by name prefix, in name order, a page at a time.
type ListRequest struct {
	Prefix string
	// After continues a listing after this name (the last name of the previous page).
	After string
	// Limit is the page size: 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
	Stale bool
}

// List limits.
const (
	DefaultListLimit = 1000
	MaxListLimit     = 10000
)

// ListResponse is one page of locks. More says another page exists; ask again
// with After set to the last name.
type ListResponse struct {
	Locks    []LockView `json:"locks"`
	More     bool       `json:"more"`
	Revision uint64     `json:"revision"`
	// Revisions is set on a page merged over several shards: each shard's
	// revision (Revision is then 0).
	Revisions map[string]uint64 `json:"revisions,omitempty"`
	Stale     *StaleRead        `json:"-"` // as LockView.Stale
	// SplitGroups are the Raft groups split off the answering shard, read
	// with the page: names moved to them are not in it, so a sharded
	// cluster's router lists them too (or refuses) when its map lacks
	// them. As KeepAliveResponse.SplitGroups, it travels only between nodes.
	SplitGroups []uint64 `json:"split_groups,omitempty"`
}

// ElectionListResponse is one page of elections, like ListResponse.
type ElectionListResponse struct {
	Elections []ElectionView `json:"elections"`
	More      bool           `json:"more"`
	Revision  uint64         `json:"revision"`
	// Revisions is as ListResponse.Revisions.
	Revisions map[string]uint64 `json:"revisions,omitempty"`
	Stale     *StaleRead        `json:"-"` // as LockView.Stale
	// SplitGroups is as ListResponse.SplitGroups.
	SplitGroups []uint64 `json:"split_groups,omitempty"`
}

// CreateSessionRequest creates an explicit session (a lease kept alive by
// keepalives, for holding many locks).
type CreateSessionRequest struct {
	ClientID  string `json:"client_id"`
	TTLms     int64  `json:"ttl_ms"`
	RequestID string `json:"request_id,omitempty"`
	// LeaseID, when set, is the id the session gets instead of one the
	// leader draws: the shard router gives a session's lease the same id on
	// every shard. Never from a client.
	LeaseID command.LeaseID `json:"-"`
}

// SessionResponse answers session create and keepalive.
type SessionResponse struct {
	SessionID string    `json:"session_id,omitempty"`
	TTLms     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	Revision  uint64    `json:"revision"`
}

// KeepAliveRequest renews a session. ClientID is optional: the session id is
// itself the capability.
type KeepAliveRequest struct {
	SessionID string `json:"-"`
	ClientID  string `json:"client_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// LostAfter: list only the grants lost after this revision (the
	// revision of the last answer the client read; 0 lists all kept).
	LostAfter uint64 `json:"lost_after,omitempty"`
}

// KeepAliveResponse is a session's renewal, with the grants it lost.
type KeepAliveResponse struct {
	SessionID string    `json:"session_id,omitempty"`
	TTLms     int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	Revision  uint64    `json:"revision"`
	// Lost are the session's grants that ended while it lived without its
	// asking — revoked, or taken over by another lease of its client —
	// after LostAfter, oldest first; never nil.
	Lost []LostGrant `json:"lost"`
	// SplitGroups are the Raft groups split off the answering shard, as its
	// state stands after the renewal: a sharded cluster's router renews
	// them too, even when its own shard map is too old to list them. It
	// travels only between nodes; the router drops it from its answer, and
	// an unsharded group, never split, has none.
	SplitGroups []uint64 `json:"split_groups,omitempty"`
}

// LostGrant is a grant a session lost while it lived.
type LostGrant struct {
	Kind         string `json:"kind"` // lock or election
	Name         string `json:"name"`
	FencingToken uint64 `json:"fencing_token"`
	Cause        string `json:"cause"` // revoked or taken_over
	Reason       string `json:"reason,omitempty"`
	Revision     uint64 `json:"revision"`
}

// DeleteSessionRequest ends a session, releasing its locks and dropping its waits.
type DeleteSessionRequest struct {
	SessionID string `json:"-"`
	ClientID  string `json:"client_id,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// DeleteSessionResponse answers a session delete.
type DeleteSessionResponse struct {
	Deleted  bool   `json:"deleted"`
	Revision uint64 `json:"revision"`
}

// Member is one node of the cluster as GET /cluster shows it.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	Version  string `json:"version,omitempty"`
	Suffrage string `json:"suffrage"`
	State    string `json:"state"`
	// Removing is true while the shard map lists the node as being removed
	// (sharded clusters only: a one-group cluster removes a member in one
	// Raft configuration change, so it never shows this).
	Removing bool `json:"removing,omitempty"`
	// Reachable, AppliedIndex and LastContactMs come from a probe of the member
	// by the answering node (LastContactMs: the probe's round trip, or for the
	// answering follower itself the time since it heard from the leader).
	// They are present only when probed (GET /cluster?health=true).
	Reachable     *bool   `json:"reachable,omitempty"`
	AppliedIndex  uint64  `json:"applied_index,omitempty"`
	LastContactMs float64 `json:"last_contact_ms,omitempty"`
}

// ClusterInfo is the answer of GET /cluster.
type ClusterInfo struct {
	NodeID       string   `json:"node_id"`
	LeaderID     string   `json:"leader_id"`
	LeaderAPI    string   `json:"leader_api_addr,omitempty"`
	Term         uint64   `json:"term"`
	Members      []Member `json:"members"`
	CommitIndex  uint64   `json:"commit_index"`
	AppliedIndex uint64   `json:"applied_index"`
	Revision     uint64   `json:"revision"`
	LastToken    uint64   `json:"last_fencing_token"`
	// CheckpointIndex and CheckpointDigest are this node's newest state
	// checkpoint (every 256 indexes): nodes that show the same index must
	// show the same digest, or their states diverged.
	CheckpointIndex  uint64 `json:"checkpoint_index,omitempty"`
	CheckpointDigest string `json:"checkpoint_digest,omitempty"`
	// Shards is set on a sharded cluster: every shard as this node sees it
	// (the fields above are then shard 0's).
	Shards []ShardInfo `json:"shards,omitempty"`
	// ShardGeneration is the shard map's generation this node routes by
	// (sharded clusters only): 1 as created, one more per split.
	ShardGeneration uint64 `json:"shard_generation,omitempty"`
}

// SplitRequest splits a sharded cluster's range at At (POST
// /cluster/shards/split): the names whose top-level segment is At or above
// move to a new shard.
type SplitRequest struct {
	At string `json:"at"`
}

// ShardInfo is one shard of a sharded cluster in GET /cluster: its key
// range (by top-level name segment; End "" is open), its Raft group's
// leader and term, and this node's commit and applied index in it.
type ShardInfo struct {
	ID           int    `json:"id"`
	Start        string `json:"start"`
	End          string `json:"end"`
	LeaderID     string `json:"leader_id"`
	LeaderAPI    string `json:"leader_api_addr,omitempty"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	Revision     uint64 `json:"revision"`
	LastToken    uint64 `json:"last_fencing_token"`
	// Replicas are the ids of the nodes that run the shard's group;
	// Leaving is the one a move is taking off it, while it is in flight.
	Replicas []string `json:"replicas,omitempty"`
	Leaving  string   `json:"leaving,omitempty"`
}

// MoveRequest moves shard Shard's replica on node From to node To (POST
// /cluster/shards/move).
type MoveRequest struct {
	Shard int    `json:"shard"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// CampaignRequest joins an election: wait in its FIFO queue (WaitTimeoutMs) to
// become leader with Value. Like an acquire, exactly one of TTLms or SessionID.
type CampaignRequest struct {
	Name          string `json:"-"`
	CandidateID   string `json:"candidate_id"`
	Value         string `json:"value"`
	TTLms         int64  `json:"ttl_ms,omitempty"`
	SessionID     string `json:"session_id,omitempty"`
	WaitTimeoutMs int64  `json:"wait_timeout_ms,omitempty"`
	RequestID     string `json:"request_id,omitempty"`
	// Takeover is AcquireRequest.Takeover for the candidate_id's other
	// leases.
	Takeover bool `json:"takeover,omitempty"`
}

// ElectionLeader is the current winner of an election.
type ElectionLeader struct {
	CandidateID  string    `json:"candidate_id"`
	Value        string    `json:"value"`
	FencingToken uint64    `json:"fencing_token"`
	Since        time.Time `json:"since"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
}

// CampaignResponse answers a campaign. When Leader is false the error says why
// (lock_held or wait_timeout) and Current names the leader.
type CampaignResponse struct {
	Leader       bool            `json:"leader"`
	FencingToken uint64          `json:"fencing_token,omitempty"`
	TokenProof   string          `json:"token_proof,omitempty"`
	LeaseRef     string          `json:"lease_ref,omitempty"`
	ExpiresAt    time.Time       `json:"expires_at,omitzero"`
	LeaseID      string          `json:"lease_id,omitempty"`
	Revision     uint64          `json:"revision,omitempty"`
	Current      *ElectionLeader `json:"current,omitempty"`
}

// ElectionView is the public state of one election.
type ElectionView struct {
	Name        string          `json:"name"`
	Leader      *ElectionLeader `json:"leader"`
	Campaigners int             `json:"campaigners"`
	Revision    uint64          `json:"revision"`
	Stale       *StaleRead      `json:"-"` // as LockView.Stale
}

// ProclaimRequest changes the leader's value; the token and lease id prove the
// caller is the leader.
type ProclaimRequest struct {
	Name         string `json:"-"`
	CandidateID  string `json:"candidate_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	Value        string `json:"value"`
	RequestID    string `json:"request_id,omitempty"`
}

// ProclaimResponse answers a proclaim.
type ProclaimResponse struct {
	Proclaimed bool   `json:"proclaimed"`
	Revision   uint64 `json:"revision"`
}

// ResignRequest gives up leadership; the next campaigner is elected at once.
type ResignRequest struct {
	Name         string `json:"-"`
	CandidateID  string `json:"candidate_id"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	RequestID    string `json:"request_id,omitempty"`
}

// ResignResponse answers a resign.
type ResignResponse struct {
	Resigned bool   `json:"resigned"`
	Revision uint64 `json:"revision"`
}

// WatchRequest streams events for names starting with Prefix, from
// FromRevision on (0: from now).
type WatchRequest struct {
	Prefix       string
	FromRevision uint64
	// FromRevisions is a sharded cluster's resume vector: per shard id, the
	// first revision wanted (that shard's last delivered revision + 1).
	// Only the shard router reads it.
	FromRevisions map[int]uint64
	// FollowSplits adds this shard's split events to the stream (the
	// router's merged streams follow them; never set from a request).
	FollowSplits bool
}

// WatchEvent is one state change as watchers see it.
type WatchEvent struct {
	Revision     uint64    `json:"revision"`
	Type         string    `json:"type"`
	Kind         string    `json:"kind"`
	Name         string    `json:"name,omitempty"`
	ClientID     string    `json:"client_id,omitempty"`
	FencingToken uint64    `json:"fencing_token,omitempty"`
	Cause        string    `json:"cause,omitempty"`
	Value        string    `json:"value,omitempty"`
	At           time.Time `json:"at"`
	// Mode is a lock event's grant or wait mode (acquired, released,
	// expired, queued, dequeued): "exclusive" or "shared"; Subtree says it
	// covers the names below.
	Mode    string `json:"mode,omitempty"`
	Subtree bool   `json:"subtree,omitempty"`
	// Reason is a revoke's reason (type "revoked").
	Reason string `json:"reason,omitempty"`
	// Shard and Revisions are set on a stream merged over the shards of a
	// sharded cluster: the event's shard, and every shard's revision as it
	// stands after this event (the stream's resume vector).
	Shard     *int              `json:"shard,omitempty"`
	Revisions map[string]uint64 `json:"revisions,omitempty"`
}

// MemberRequest adds a node to the cluster (it joins as a non-voter and is
// promoted once caught up).
type MemberRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
}

// TransferRequest hands leadership to ID, or to the best voter when empty.
type TransferRequest struct {
	ID string `json:"id,omitempty"`
}

// RotateTokenKeyRequest is the optional body of POST
// /api/v1/cluster/token-key/rotate. With RevokeRetired every retired key is
// dropped too, so only the new key verifies proofs: for a key that may have
// leaked. Proofs already handed out under the retired keys stop verifying,
// and their holders' writes are refused until they acquire again.
type RotateTokenKeyRequest struct {
	RevokeRetired bool `json:"revoke_retired,omitempty"`
}
