// Membership: join (as a non-voter, promoted once caught up), remove (refused
// when it would leave the cluster without a quorum) and leadership transfer.
// Every change goes through the leader, one at a time, as Raft requires.

package raftnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
)

// PromoteLag is how far a non-voter's applied index may trail the leader's
// commit index for it to be promoted to voter.
const PromoteLag = 256

// membershipMu serialises membership changes made through this node, so the
// quorum check and the change it guards cannot interleave with another.
var membershipMu sync.Mutex

// wireError carries a leader's client-facing error back to the forwarding node.
type wireError struct {
	Code    apierror.Code `json:"code"`
	Message string        `json:"message"`
}

type memberRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr,omitempty"`
}

// Join adds a server as a non-voter (idempotent); the leader promotes it once it
// has caught up. Followers forward the request to the leader.
func (n *Node) Join(ctx context.Context, id, raftAddr string) error {
	if id == "" || raftAddr == "" {
		return apierror.New(apierror.InvalidArgument, "join needs the new node's id and raft_addr")
	}
	return n.onLeader(ctx, "/forward/join", memberRequest{ID: id, RaftAddr: raftAddr}, repeatable, func() error {
		return n.joinLocal(id, raftAddr)
	})
}

func (n *Node) joinLocal(id, addr string) error {
	membershipMu.Lock()
	defer membershipMu.Unlock()
	cfg, err := n.configuration()
	if err != nil {
		return err
	}
	for _, s := range cfg.Servers {
		if string(s.ID) == id && string(s.Address) == addr {
			return nil // already a member: joining again is a no-op
		}
		if string(s.ID) == id || string(s.Address) == addr {
			return apierror.New(apierror.InvalidArgument, "a member with id %q or raft address %s already exists with other details; remove it first (dlock members remove %s)", s.ID, s.Address, s.ID)
		}
	}
	if err := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return fmt.Errorf("add %s as non-voter: %w", id, err)
	}
	n.logger.Info("member joined as non-voter; promoting once caught up", "member", id, "raft_addr", addr)
	return nil
}

// Remove takes a server out of the cluster. It refuses a change that would
// leave fewer reachable voters than a quorum of the remaining configuration.
func (n *Node) Remove(ctx context.Context, id string) error {
	if id == "" {
		return apierror.New(apierror.InvalidArgument, "remove needs the member id")
	}
	// Removing twice finds the member gone: after an attempt whose answer was
	// lost, that means it worked.
	return n.onLeader(ctx, "/forward/remove", memberRequest{ID: id}, doneIfGone, func() error {
		return n.removeLocal(ctx, id)
	})
}

func (n *Node) removeLocal(ctx context.Context, id string) error {
	membershipMu.Lock()
	defer membershipMu.Unlock()
	cfg, err := n.configuration()
	if err != nil {
		return err
	}
	var target *raft.Server
	var voters []raft.Server
	for i, s := range cfg.Servers {
		if string(s.ID) == id {
			target = &cfg.Servers[i]
		}
		if s.Suffrage == raft.Voter && string(s.ID) != id {
			voters = append(voters, s)
		}
	}
	if target == nil {
		return apierror.New(apierror.NotFound, "no member %q; see GET /api/v1/cluster for the members", id)
	}
	if target.Suffrage == raft.Voter {
		if len(voters) == 0 {
			return apierror.New(apierror.InvalidArgument, "refusing to remove the last voter")
		}
		reachable := 0
		for _, v := range voters {
			if string(v.ID) == n.cfg.ID || n.probe(ctx, string(v.Address)) == nil {
				reachable++
			}
		}
		if quorum := len(voters)/2 + 1; reachable < quorum {
			return apierror.New(apierror.InvalidArgument,
				"refusing to remove %s: only %d of the remaining %d voters are reachable, fewer than a quorum of %d; bring nodes back first", id, reachable, len(voters), quorum)
		}
	}
	if id == n.cfg.ID && len(voters) > 0 {
		// Removing the leader itself: hand leadership to another voter first
		// (as a graceful stop does), so the cluster does not wait out an
		// election timeout after this node steps down; the new leader then
		// removes this node when the request is retried there. If the
		// transfer fails, remove it here anyway.
		if err := n.raft.LeadershipTransfer().Error(); err == nil {
			n.logger.Info("handed leadership on before removing this node", "member", id)
			return &apierror.Error{Code: apierror.Unavailable, RetryAfter: 100 * time.Millisecond, Err: raft.ErrNotLeader,
				Message: "leadership moved on before removing this node; retry on the new leader"}
		}
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	n.logger.Info("member removed", "member", id)
	return nil
}

// TransferLeadership hands leadership to id (or to the most caught-up voter
// when id is empty).
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	// A transfer to a named voter is repeatable (the second finds it leading);
	// one to "any voter" would move leadership twice.
	how := repeatable
	if id == "" {
		how = once
	}
	return n.onLeader(ctx, "/forward/transfer", memberRequest{ID: id}, how, func() error {
		var f raft.Future
		if id == "" {
			f = n.raft.LeadershipTransfer()
		} else {
			cfg, err := n.configuration()
			if err != nil {
				return err
			}
			var addr raft.ServerAddress
			for _, s := range cfg.Servers {
				if string(s.ID) == id && s.Suffrage == raft.Voter {
					addr = s.Address
				}
			}
			if addr == "" {
				return apierror.New(apierror.NotFound, "no voter %q to transfer leadership to", id)
			}
			if id == n.cfg.ID {
				return nil
			}
			f = n.raft.LeadershipTransferToServer(raft.ServerID(id), addr)
		}
		if err := f.Error(); err != nil {
			return apierror.Wrap(apierror.Unavailable, err, "leadership transfer failed: %v; retry", err)
		}
		return nil
	})
}

func (n *Node) configuration() (raft.Configuration, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, fmt.Errorf("read raft configuration: %w", err)
	}
	return f.Configuration(), nil
}

// memberRetry says what onLeader may do after a forward whose answer was lost
// (the leader may have acted on it).
type memberRetry int

const (
	repeatable memberRetry = iota // send it again: doing it twice is doing it once
	doneIfGone                    // send it again; a not_found then means it was done
	once                          // never again: answer "outcome unknown"
)

// onLeader runs local on the leader, or forwards req to the leader's path and
// retries through elections until ctx ends.
func (n *Node) onLeader(ctx context.Context, path string, req memberRequest, how memberRetry, local func() error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.ApplyTimeout)
		defer cancel()
	}
	body, _ := json.Marshal(req)
	lost := false // an earlier forward may have been acted on
	gone := func(err error) error {
		if lost && how == doneIfGone && apierror.From(err).Code == apierror.NotFound {
			return nil
		}
		return err
	}
	for {
		var err error
		if n.raft.State() == raft.Leader && n.ready.Load() {
			err = local()
			if err == nil || !errors.Is(err, raft.ErrNotLeader) {
				return gone(err)
			}
		} else if addr, ok := n.leaderAddr(); ok {
			var resp []byte
			var status int
			resp, status, err = n.forward(ctx, addr, path, body)
			var op *net.OpError
			if err != nil && !(errors.As(err, &op) && op.Op == "dial") {
				lost = true
				if how == once {
					return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: err,
						Message: "the request reached the leader but its answer was lost, so it was not sent again (it would act twice); read GET /api/v1/cluster to see whether it took effect"}
				}
			}
			if err == nil {
				switch status {
				case http.StatusOK:
					return nil
				case http.StatusServiceUnavailable:
					err = errRetry
				default:
					var e wireError
					if json.Unmarshal(resp, &e) == nil && e.Code != "" {
						return gone(&apierror.Error{Code: e.Code, Message: e.Message})
					}
					return fmt.Errorf("leader answered %d: %s", status, resp)
				}
			}
		}
		select {
		case <-ctx.Done():
			return n.unavailable(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serveMember handles a forwarded membership request on the leader.
func (n *Node) serveMember(do func(memberRequest) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req memberRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if n.raft.State() != raft.Leader || !n.ready.Load() {
			http.Error(w, "not the leader", http.StatusServiceUnavailable)
			return
		}
		if err := do(req); err != nil {
			ae := apierror.From(err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(apierror.HTTPStatus(ae.Code))
			_ = json.NewEncoder(w).Encode(wireError{Code: ae.Code, Message: ae.Message})
			return
		}
		w.WriteHeader(http.StatusOK)
	}
}

// probe checks that a node answers on its raft port's forwarding side.
func (n *Node) probe(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, status, err := n.forward(ctx, addr, "/forward/status", nil)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	return err
}

// promoteCaughtUp runs on the leader: a non-voter whose applied index is within
// PromoteLag of the commit index becomes a voter.
func (n *Node) promoteCaughtUp(ctx context.Context) {
	cfg, err := n.configuration()
	if err != nil {
		return
	}
	for _, s := range cfg.Servers {
		if s.Suffrage != raft.Nonvoter {
			continue
		}
		applied, err := n.remoteApplied(ctx, string(s.Address))
		if err != nil || applied+PromoteLag < n.raft.CommitIndex() {
			continue
		}
		membershipMu.Lock()
		err = awaitFuture(ctx, n.raft.AddVoter(s.ID, s.Address, 0, 10*time.Second))
		membershipMu.Unlock()
		if err != nil {
			n.logger.Warn("promoting caught-up member failed; will retry", "member", s.ID, "err", err)
			continue
		}
		n.logger.Info("member caught up and promoted to voter", "member", s.ID, "applied", applied)
	}
}

func (n *Node) remoteApplied(ctx context.Context, addr string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	body, status, err := n.forward(ctx, addr, "/forward/status", nil)
	if err != nil || status != http.StatusOK {
		return 0, fmt.Errorf("status of %s: %d %v", addr, status, err)
	}
	var st struct {
		Applied uint64 `json:"applied"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return 0, err
	}
	return st.Applied, nil
}

// runPromoter checks for caught-up non-voters while this node leads.
func (n *Node) runPromoter(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n.ready.Load() {
				n.promoteCaughtUp(ctx)
			}
		}
	}
}

// Leave removes this node from the cluster, handing leadership on first if it
// leads (graceful leave on shutdown).
func (n *Node) Leave(ctx context.Context) error {
	if n.raft.State() == raft.Leader {
		if err := n.raft.LeadershipTransfer().Error(); err != nil {
			return fmt.Errorf("hand leadership on before leaving: %w", err)
		}
	}
	return n.Remove(ctx, n.cfg.ID)
}

// HandOffLeadership transfers leadership away if this node leads, so a planned
// stop costs clients no election timeout. Best effort.
func (n *Node) HandOffLeadership() {
	if n.raft.State() != raft.Leader {
		return
	}
	if err := n.raft.LeadershipTransfer().Error(); err != nil {
		n.logger.Warn("could not hand leadership on before stopping", "err", err)
		return
	}
	n.logger.Info("handed leadership on before stopping")
}
