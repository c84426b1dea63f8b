// Package loopback picks free ports for local clusters — tests, the chaos
// suite, the failover benchmark — outside the kernel's ephemeral port range,
// so an outgoing connection can never take a node's port while the node is
// down between a kill and its restart on the same port.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// PortRange is where ports are picked: below (or above) the kernel's
// ephemeral range when there is room, else 20000-32000.
func PortRange() (lo, hi int) {
	lo, hi = 20000, 32000
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	eLo, err1 := strconv.Atoi(f[0])
	eHi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return lo, hi
	}
	switch {
	case eLo-10000 >= 2000:
		return 10000, eLo - 1
	case 65535-eHi >= 2000:
		return eHi + 1, 65535
	}
	return lo, hi
}

// FreeBase finds base such that base+off is free on every host for every
// offset (each is listened on, then closed). intn draws the candidates.
func FreeBase(hosts []string, offsets []int, intn func(int) int) (int, error) {
	lo, hi := PortRange()
	maxOff := 0
	for _, off := range offsets {
		maxOff = max(maxOff, off)
	}
	for range 200 {
		base := lo + intn(hi-lo-maxOff)
		var lns []net.Listener
		free := true
		for _, h := range hosts {
			for _, off := range offsets {
				ln, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(base+off)))
				if err != nil {
					free = false
					break
				}
				lns = append(lns, ln)
			}
			if !free {
				break
			}
		}
		for _, ln := range lns {
			ln.Close()
		}
		if free {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no free port range on %v in [%d, %d)", hosts, lo, hi)
}

// Span is the offsets 0..n-1.
func Span(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

var (
	addrsMu    sync.Mutex
	addrsGiven = map[string]bool{}
)

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago,
// outside the kernel's ephemeral range and never handed out twice in one
// process: two nodes of one test cluster asking one after the other cannot
// be given the same port (the kernel's port 0 can hand out a just-closed
// one again, and did, in CI).
func FreeAddr() (string, error) {
	addrsMu.Lock()
	defer addrsMu.Unlock()
	for range 100 {
		base, err := FreeBase([]string{"127.0.0.1"}, []int{0}, rand.IntN)
		if err != nil {
			return "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(base))
		if !addrsGiven[addr] {
			addrsGiven[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no free port on 127.0.0.1 not handed out before")
}
