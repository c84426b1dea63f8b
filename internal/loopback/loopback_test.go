package loopback

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr never hands one address out twice, however often the kernel
// would offer the same free port, and stays inside PortRange.
func TestFreeAddrIsNeverGivenTwice(t *testing.T) {
	lo, hi := PortRange()
	seen := map[string]bool{}
	for range 500 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < lo || port >= hi {
			t.Fatalf("port %d outside [%d, %d)", port, lo, hi)
		}
	}
}
