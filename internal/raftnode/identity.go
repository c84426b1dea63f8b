// Member identity: before the leader adds a server, or promotes one to voter,
// it checks that the address is a well-formed host:port, that it does not
// name an existing member under another spelling (localhost for 127.0.0.1),
// and that the node answering there, over the raft port and its peer TLS,
// calls itself by the id being added. An alias of a member admitted as a new
// voter gives one process two votes; two of them wedged a 3-node cluster.

package raftnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
)

// IdentityTimeout bounds the leader's check of a new member: resolving its
// address, and dialling it to ask who it is.
const IdentityTimeout = 3 * time.Second

// checkRaftAddr refuses what is not host:port with a host and a numeric port.
func checkRaftAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && host == "" {
		err = errors.New("no host")
	}
	if err == nil {
		if p, perr := strconv.ParseUint(port, 10, 16); perr != nil || p == 0 {
			err = fmt.Errorf("port %q is not a number from 1 to 65535", port)
		}
	}
	if err != nil {
		return apierror.New(apierror.InvalidArgument, "raft_addr %q is not host:port (%v): give the new node's --raft-advertise address, e.g. 10.0.0.4:7071", addr, err)
	}
	return nil
}

// resolveRaftAddr is the set of ip:port an address names. An unspecified IP
// (0.0.0.0, ::) is refused: other nodes cannot dial it as the member.
func resolveRaftAddr(ctx context.Context, addr string) ([]string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		if ip.IP.IsUnspecified() {
			return nil, fmt.Errorf("%s is an unspecified address", ip.IP)
		}
		out = append(out, net.JoinHostPort(ip.IP.String(), port))
	}
	return out, nil
}

// checkNewMember runs on the leader before id is added at addr: addr must
// resolve, must not resolve to where an existing member (other than id
// itself) is, and the node there must answer as id.
func (n *Node) checkNewMember(ctx context.Context, id, addr string, members []raft.Server) error {
	ctx, cancel := context.WithTimeout(ctx, IdentityTimeout)
	defer cancel()
	mine, err := resolveRaftAddr(ctx, addr)
	if err != nil {
		return apierror.Wrap(apierror.InvalidArgument, err, "raft_addr %s does not resolve to an address other nodes can dial (%v)", addr, err)
	}
	for _, m := range members {
		if string(m.ID) == id {
			continue
		}
		theirs, err := resolveRaftAddr(ctx, string(m.Address))
		if err != nil {
			continue // a member whose address no longer resolves is no alias
		}
		for _, a := range mine {
			if slices.Contains(theirs, a) {
				return apierror.New(apierror.InvalidArgument,
					"raft_addr %s resolves to %s, the raft address of existing member %s (%s): one node cannot be two members; give the new node's own address", addr, a, m.ID, m.Address)
			}
		}
	}
	return n.verifyIdentity(ctx, id, addr)
}

// verifyIdentity asks the node at addr, over the raft port (with the peers'
// TLS), which node it is, and requires the answer id.
//
// It also requires the node's replication engine to be this cluster's: the
// two speak different protocols on the raft port, so a member of the other
// engine would never catch up (and a new data dir takes the default engine
// unless told otherwise, which an older cluster may not run).
func (n *Node) verifyIdentity(ctx context.Context, id, addr string) error {
	st, err := n.remoteStatus(ctx, addr)
	if err == nil && st.ID == "" {
		err = errors.New("its answer names no node id")
	}
	if err != nil {
		return apierror.Wrap(apierror.InvalidArgument, err,
			"could not reach %s to verify that it is %s (%v): start the new node first (dlock serve --id %s --join ...), and check the address and the peer TLS settings", addr, id, err, id)
	}
	if st.ID != id {
		return apierror.New(apierror.InvalidArgument,
			"the node at %s answered as %s, not %s: raft_addr must be the new node's own --raft-advertise address", addr, st.ID, id)
	}
	if st.Engine != "" && st.Engine != n.cfg.Engine {
		return apierror.New(apierror.InvalidArgument,
			"the node %s at %s runs the %s replication engine and this cluster the %s engine: every member runs the cluster's engine; stop %s, and start it again with a new, empty data dir and --raft-engine %s",
			id, addr, st.Engine, n.cfg.Engine, id, n.cfg.Engine)
	}
	return nil
}

// nodeStatus is a node's answer on /forward/status.
type nodeStatus struct {
	ID      string `json:"id"`
	Applied uint64 `json:"applied"`
	// Engine is the node's replication engine ("" from a build before
	// engines were reported).
	Engine EngineKind `json:"engine"`
}

func (n *Node) remoteStatus(ctx context.Context, addr string) (nodeStatus, error) {
	body, status, err := n.forward(ctx, addr, "/forward/status", nil)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("status %d", status)
	}
	var st nodeStatus
	if err == nil {
		err = json.Unmarshal(body, &st)
	}
	return st, err
}

func (n *Node) remoteApplied(ctx context.Context, addr string) (uint64, error) {
	st, err := n.remoteStatus(ctx, addr)
	if err != nil {
		return 0, fmt.Errorf("status of %s: %w", addr, err)
	}
	return st.Applied, nil
}

// RunsGroup asks the node at addr, over the raft port, whether it runs
// this node's Raft group: false when it answers that it does not (a node
// of a sharded cluster started with another shard map runs another meta
// group); an error when it cannot be asked (an *apierror.Error when addr
// is not host:port).
func (n *Node) RunsGroup(ctx context.Context, addr string) (bool, error) {
	if err := checkRaftAddr(addr); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, IdentityTimeout)
	defer cancel()
	body, status, err := n.forward(ctx, addr, "/forward/status", nil)
	switch {
	case err != nil:
		return false, err
	case status == http.StatusOK:
		return true, nil
	case status == http.StatusServiceUnavailable:
		return false, nil
	default:
		return false, fmt.Errorf("status %d: %.200s", status, body)
	}
}
