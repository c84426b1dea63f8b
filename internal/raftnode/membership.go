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
// Unknown marks a change that may or may not take effect (errChangeUnknown);
// leaders of earlier versions answered that case with a 500 instead.
type wireError struct {
	Code    apierror.Code `json:"code"`
	Message string        `json:"message"`
	Unknown bool          `json:"unknown,omitempty"`
}

// errChangeUnknown is the cause of a membership change whose outcome is not
// known: Raft appended it, then this node lost leadership before it
// committed. A later leader may still commit it, or not.
var errChangeUnknown = errors.New("leadership lost while the change was being committed")

// changeErr is the error of a membership change Raft did not finish. With
// raft.ErrLeadershipLost the outcome is unknown, so the answer says so and
// onLeader may send the change again where that cannot act twice; anything
// else keeps its cause (raft.ErrNotLeader: not appended, sent again).
func changeErr(what string, err error) error {
	if errors.Is(err, raft.ErrLeadershipLost) {
		return outcomeUnknown(what+": leadership was lost before the change committed, so it may or may not take effect",
			fmt.Errorf("%w: %w", errChangeUnknown, err))
	}
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrEnqueueTimeout) {
		// Refused before it reached the log (a leadership change, or a
		// transfer still running after it timed out): nothing happened.
		return &apierror.Error{Code: apierror.Unavailable, RetryAfter: 200 * time.Millisecond, Err: fmt.Errorf("%s: %w", what, err),
			Message: what + ": the leader is changing and the change was not made; retry"}
	}
	if errors.Is(err, raft.ErrRaftShutdown) {
		return outcomeUnknown(what+": the node stopped while the change was in flight, so it may or may not take effect", fmt.Errorf("%w: %w", errChangeUnknown, err))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// outcomeUnknown is the client's answer to a membership change that may have
// been acted on: look, then decide.
func outcomeUnknown(msg string, cause error) *apierror.Error {
	return &apierror.Error{Code: apierror.Unavailable, RetryAfter: time.Second, Err: cause,
		Message: msg + "; read GET /api/v1/cluster to see whether it took effect before you retry"}
}

type memberRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr,omitempty"`
}

// Join adds a server as a non-voter (idempotent); the leader promotes it once it
// has caught up. Followers forward the request to the leader, which first
// checks the new member's identity (checkNewMember).
func (n *Node) Join(ctx context.Context, id, raftAddr string) error {
	if id == "" || raftAddr == "" {
		return apierror.New(apierror.InvalidArgument, "join needs the new node's id and raft_addr")
	}
	if err := checkRaftAddr(raftAddr); err != nil {
		return err
	}
	return n.onLeader(ctx, "/forward/join", memberRequest{ID: id, RaftAddr: raftAddr}, repeatable, func() error {
		return n.joinLocal(ctx, id, raftAddr)
	})
}

func (n *Node) joinLocal(ctx context.Context, id, addr string) error {
	if err := checkRaftAddr(addr); err != nil {
		return err
	}
	cfg, err := n.configuration()
	if err != nil {
		return err
	}
	if done, err := sameOrClash(cfg, id, addr); done || err != nil {
		return err
	}
	// Dial the candidate without holding membershipMu: the check may take
	// IdentityTimeout, and other changes need not wait for it.
	if err := n.checkNewMember(ctx, id, addr, cfg.Servers); err != nil {
		return err
	}
	membershipMu.Lock()
	defer membershipMu.Unlock()
	if cfg, err = n.configuration(); err != nil {
		return err
	}
	if done, err := sameOrClash(cfg, id, addr); done || err != nil {
		return err
	}
	if err := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second).Error(); err != nil {
		return changeErr("add "+id+" as non-voter", err)
	}
	n.logger.Info("member joined as non-voter; promoting once caught up", "member", id, "raft_addr", addr)
	return nil
}

// sameOrClash says whether id at addr is already a member (done: joining
// again is a no-op), or refuses a member that has the id or the address with
// other details.
func sameOrClash(cfg raft.Configuration, id, addr string) (done bool, err error) {
	for _, s := range cfg.Servers {
		if string(s.ID) == id && string(s.Address) == addr {
			return true, nil
		}
		if string(s.ID) == id || string(s.Address) == addr {
			return false, apierror.New(apierror.InvalidArgument, "a member with id %q or raft address %s already exists with other details; remove it first (dlock members remove %s)", s.ID, s.Address, s.ID)
		}
	}
	return false, nil
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
		return changeErr("remove "+id, err)
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
	// maybeActed notes an attempt that may have taken effect: repeat it only
	// where that cannot act twice.
	maybeActed := func(cause error) error {
		lost = true
		if how == once {
			return outcomeUnknown("the request reached the leader but its outcome is unknown (its answer was lost, or leadership was lost before it committed), so it was not sent again (it would act twice)", cause)
		}
		return nil
	}
	asked := 0
	for {
		var err error
		if n.raft.State() == raft.Leader && n.ready.Load() {
			err = local()
			switch {
			case err == nil:
				return nil
			case errors.Is(err, raft.ErrNotLeader):
				// Not appended: send it to the new leader.
			case errors.Is(err, errChangeUnknown):
				if stop := maybeActed(err); stop != nil {
					return stop
				}
			default:
				return gone(err)
			}
		} else if addr, ok := n.memberTarget(req, how, lost, &asked); ok {
			var resp []byte
			var status int
			resp, status, err = n.forward(ctx, addr, path, body)
			var op *net.OpError
			if err != nil && !(errors.As(err, &op) && op.Op == "dial") {
				if stop := maybeActed(err); stop != nil {
					return stop
				}
			}
			if err == nil {
				var e wireError
				known := json.Unmarshal(resp, &e) == nil && e.Code != ""
				switch {
				case status == http.StatusOK:
					return nil
				case known && e.Unknown:
					if stop := maybeActed(errChangeUnknown); stop != nil {
						return stop
					}
					err = errRetry
				case status == http.StatusServiceUnavailable:
					err = errRetry
				case known:
					return gone(&apierror.Error{Code: e.Code, Message: e.Message, Err: fmt.Errorf("forwarded %s to leader %s: status %d", path, addr, status)})
				default:
					return fmt.Errorf("leader answered %d: %s", status, resp)
				}
			}
		}
		select {
		case <-ctx.Done():
			if lost {
				return outcomeUnknown("the change may have been made, but no leader confirmed it before the deadline", ctx.Err())
			}
			return n.unavailable(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// memberTarget is where onLeader sends req next: the leader this node knows
// of, or, for a node that may already have removed itself (a removed node
// stops hearing from the leader, so never learns one again), each other member
// in turn: a follower answers 503 and the leader not_found, which means done.
func (n *Node) memberTarget(req memberRequest, how memberRetry, lost bool, asked *int) (string, bool) {
	if addr, ok := n.leaderAddr(); ok {
		return addr, true
	}
	if !lost || how != doneIfGone || req.ID != n.cfg.ID {
		return "", false
	}
	cfg, err := n.configuration()
	if err != nil {
		return "", false
	}
	var others []string
	for _, s := range cfg.Servers {
		if string(s.ID) != n.cfg.ID {
			others = append(others, string(s.Address))
		}
	}
	if len(others) == 0 {
		return "", false
	}
	*asked++
	return others[*asked%len(others)], true
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
			if ae.Code == apierror.Internal {
				n.logger.Error("forwarded membership change failed", "from", r.Header.Get("X-Dlock-From"), "err", err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(apierror.HTTPStatus(ae.Code))
			_ = json.NewEncoder(w).Encode(wireError{Code: ae.Code, Message: ae.Message, Unknown: errors.Is(err, errChangeUnknown)})
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
// PromoteLag of the commit index becomes a voter, once the node at its
// address answers with its id (a non-voter admitted under another member's
// address is never promoted; warned names those already logged this term).
func (n *Node) promoteCaughtUp(ctx context.Context, warned map[raft.ServerID]bool) {
	cfg, err := n.configuration()
	if err != nil {
		return
	}
	for _, s := range cfg.Servers {
		if s.Suffrage != raft.Nonvoter {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := n.remoteStatus(sctx, string(s.Address))
		cancel()
		if err != nil || st.Applied+PromoteLag < n.raft.CommitIndex() {
			continue
		}
		if st.ID != string(s.ID) {
			if !warned[s.ID] {
				warned[s.ID] = true
				n.logger.Warn("not promoting a non-voter: the node at its address is another node; remove it (dlock members remove)",
					"member", s.ID, "raft_addr", s.Address, "answered_as", st.ID)
			}
			continue
		}
		membershipMu.Lock()
		err = awaitFuture(ctx, n.raft.AddVoter(s.ID, s.Address, 0, 10*time.Second))
		membershipMu.Unlock()
		if err != nil {
			n.logger.Warn("promoting caught-up member failed; will retry", "member", s.ID, "err", err)
			continue
		}
		n.logger.Info("member caught up and promoted to voter", "member", s.ID, "applied", st.Applied)
	}
}

// runPromoter checks for caught-up non-voters while this node leads.
func (n *Node) runPromoter(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	warned := map[raft.ServerID]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n.ready.Load() {
				n.promoteCaughtUp(ctx, warned)
			}
		}
	}
}

// Leave removes this node from the cluster, handing leadership on first if it
// leads (graceful leave on shutdown); a leader that cannot hand on in time
// removes itself, and the others elect a leader after it steps down.
func (n *Node) Leave(ctx context.Context) error {
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
