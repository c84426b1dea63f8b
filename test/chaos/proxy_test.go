package chaos

import (
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"time"
)

// The network between the nodes. Node i listens for Raft (and node-to-node
// forwarding) on its own loopback IP, 127.0.0.(11+i), at the "real" port,
// advertises the "proxy" port on the same IP to its peers, and dials them
// from that IP (dlock's raftnode dials from the host of --raft-addr). One
// proxy per node forwards proxy port → real port and knows the sender of each
// connection by its source IP, so it can cut any directed link.
//
// A directed link a→b is "the connections a opens to b". Cutting it refuses
// (and resets) new connections from a to b and closes the established ones;
// in blackhole mode new connections are accepted and then left silent (no
// byte is forwarded either way), so the sender sees timeouts rather than
// resets. A both-ways cut of a–b cuts a→b and b→a: nothing flows between
// them. A one-way cut a→b leaves b→a open: b can still call a and get
// answers on its own connections (an asymmetric fault).

type cutMode int

const (
	linkOK cutMode = iota
	linkRefuse
	linkBlackhole
)

func (m cutMode) String() string {
	switch m {
	case linkRefuse:
		return "refuse"
	case linkBlackhole:
		return "blackhole"
	}
	return "ok"
}

type link struct{ from, to int }

// pconn is one proxied connection.
type pconn struct {
	from, to   int
	in, out    net.Conn // out is nil for a blackholed connection
	closeOnce  sync.Once
	blackholed bool
}

func (c *pconn) close() {
	c.closeOnce.Do(func() {
		if tc, ok := c.in.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset, as a dropped link would look to the sender
		}
		c.in.Close()
		if c.out != nil {
			c.out.Close()
		}
	})
}

// network is the set of proxies and the current cuts.
type network struct {
	mu      sync.Mutex
	ips     []string // node index → IP
	cuts    map[link]cutMode
	conns   map[*pconn]struct{}
	lns     []net.Listener
	targets []string
	closed  bool
	wg      sync.WaitGroup

	// counters
	accepted, refused, killed int
}

func newNetwork(ips []string) *network {
	return &network{ips: ips, cuts: map[link]cutMode{}, conns: map[*pconn]struct{}{}}
}

// nodeOf maps a source IP to a node index, -1 if it is not a node.
func (n *network) nodeOf(addr net.Addr) int {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return -1
	}
	for i, ip := range n.ips {
		if ip == host {
			return i
		}
	}
	return -1
}

// listen starts the proxy for node `to`: listen on listenAddr, forward to target.
func (n *network) listen(to int, listenAddr, target string) error {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return err
	}
	n.mu.Lock()
	for len(n.lns) <= to {
		n.lns = append(n.lns, nil)
		n.targets = append(n.targets, "")
	}
	n.lns[to], n.targets[to] = ln, target
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.handle(to, target, c)
		}
	}()
	return nil
}

func (n *network) handle(to int, target string, in net.Conn) {
	from := n.nodeOf(in.RemoteAddr())
	pc := &pconn{from: from, to: to, in: in}
	n.mu.Lock()
	mode := n.cuts[link{from, to}]
	if n.closed {
		mode = linkRefuse
	}
	switch mode {
	case linkRefuse:
		n.refused++
		n.mu.Unlock()
		pc.close()
		return
	case linkBlackhole:
		pc.blackholed = true
		n.conns[pc] = struct{}{}
		n.refused++
		n.mu.Unlock()
		// Drain nothing, answer nothing: the bytes sit in the kernel buffers.
		return
	}
	n.accepted++
	n.conns[pc] = struct{}{}
	n.mu.Unlock()

	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		out, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err != nil {
			n.drop(pc)
			return
		}
		n.mu.Lock()
		if _, still := n.conns[pc]; !still {
			n.mu.Unlock()
			out.Close()
			return
		}
		pc.out = out
		n.mu.Unlock()
		done := make(chan struct{}, 2)
		cp := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			done <- struct{}{}
		}
		go cp(out, in)
		go cp(in, out)
		<-done
		n.drop(pc)
		<-done
	}()
}

func (n *network) drop(pc *pconn) {
	n.mu.Lock()
	delete(n.conns, pc)
	n.mu.Unlock()
	pc.close()
}

// cut cuts the directed link from→to; established connections are closed.
func (n *network) cut(from, to int, mode cutMode) {
	n.mu.Lock()
	n.cuts[link{from, to}] = mode
	var victims []*pconn
	for pc := range n.conns {
		if pc.from == from && pc.to == to && !pc.blackholed {
			victims = append(victims, pc)
			delete(n.conns, pc)
		}
	}
	n.killed += len(victims)
	n.mu.Unlock()
	for _, pc := range victims {
		pc.close()
	}
}

// cutBoth cuts a→b and b→a.
func (n *network) cutBoth(a, b int, mode cutMode) {
	n.cut(a, b, mode)
	n.cut(b, a, mode)
}

// healAll removes every cut and closes blackholed connections so their
// senders reconnect.
func (n *network) healAll() {
	n.mu.Lock()
	n.cuts = map[link]cutMode{}
	var held []*pconn
	for pc := range n.conns {
		if pc.blackholed {
			held = append(held, pc)
			delete(n.conns, pc)
		}
	}
	n.mu.Unlock()
	for _, pc := range held {
		pc.close()
	}
}

// describe lists the current cuts, e.g. "n1->n2(refuse) n2->n1(refuse)".
func (n *network) describe() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var parts []string
	for l, m := range n.cuts {
		parts = append(parts, fmt.Sprintf("n%d->n%d(%s)", l.from+1, l.to+1, m))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// close stops every proxy and closes every connection.
func (n *network) close() {
	n.mu.Lock()
	n.closed = true
	lns := n.lns
	var all []*pconn
	for pc := range n.conns {
		all = append(all, pc)
	}
	n.conns = map[*pconn]struct{}{}
	n.mu.Unlock()
	for _, ln := range lns {
		if ln != nil {
			ln.Close()
		}
	}
	for _, pc := range all {
		pc.close()
	}
	n.wg.Wait()
}
