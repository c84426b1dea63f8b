package server_test

// TLS on the client API and mutual TLS between nodes, on real in-process
// clusters over loopback TCP.

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/internal/service"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
	"github.com/dlock/dlock/internal/tlsconfig"
)

// staleLock reads a lock from one node's own state (no leader involved).
func staleLock(c *testcluster.Cluster, node, name string) (service.LockView, error) {
	var v service.LockView
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Do(ctx, http.MethodGet, c.URL(node)+"/api/v1/locks/"+name+"?stale=true", nil, &v)
	return v, err
}

func TestTLSClusterReplicates(t *testing.T) {
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthOptional)
	c := testcluster.NewWith(t, 3, testcluster.Options{TLS: x})
	if u := c.URL("n1"); !strings.HasPrefix(u, "https://") {
		t.Fatalf("URL %q, want https", u)
	}
	// Through a follower: the write is forwarded to the leader over mTLS,
	// and replicated to every node.
	follower := c.Follower()
	code, a := acquire(t, c, follower, "tls/a", map[string]any{"client_id": "c1", "ttl_ms": 60000})
	if code != http.StatusOK || !a.Acquired {
		t.Fatalf("acquire over https via %s: %d %+v", follower, code, a)
	}
	for _, id := range c.IDs() {
		testutil.Eventually(t, 10*time.Second, id+" has the grant", func() bool {
			v, err := staleLock(c, id, "tls/a")
			return err == nil && v.Held && v.Holder.FencingToken == a.FencingToken
		})
	}

	t.Run("HTTPSNeedsTheCA", func(t *testing.T) {
		res, err := http.Get(c.URL("n1") + "/api/v1/cluster")
		if err == nil {
			res.Body.Close()
			t.Fatalf("https without the CA: got %s, want a certificate error", res.Status)
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("https without the CA: %v, want a certificate error", err)
		}
		// Plain http to the TLS port gets no answer from dlock.
		plain := strings.Replace(c.URL("n1"), "https://", "http://", 1)
		if res, err := http.Get(plain + "/api/v1/cluster"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				t.Fatalf("plain http to the TLS API port answered 200")
			}
		}
		// A client without a certificate is let in when certificates are optional.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: testcluster.ClientTLS(t, x.Files, false)}}
		defer hc.CloseIdleConnections()
		res, err = hc.Get(c.URL("n1") + "/api/v1/cluster")
		if err != nil {
			t.Fatalf("https with the CA and no client certificate: %v", err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("https with the CA: %s", res.Status)
		}
	})

	t.Run("GRPCOverTLS", func(t *testing.T) {
		cc, err := grpc.NewClient(c.GRPCAddr(follower), grpc.WithTransportCredentials(credentials.NewTLS(x.Client)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := dlockv1.NewLockServiceClient(cc).GetLock(ctx, &dlockv1.GetLockRequest{Name: "tls/a"})
		if err != nil {
			t.Fatalf("GetLock over gRPC+TLS: %v", err)
		}
		if !res.GetLock().GetHeld() || res.GetLock().GetHolder().GetFencingToken() != a.FencingToken {
			t.Fatalf("GetLock over gRPC+TLS: %+v, want held with token %d", res.GetLock(), a.FencingToken)
		}
		plain, err := grpc.NewClient(c.GRPCAddr(follower), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer pcancel()
		if _, err := dlockv1.NewLockServiceClient(plain).GetLock(pctx, &dlockv1.GetLockRequest{Name: "tls/a"}); err == nil {
			t.Fatalf("plaintext gRPC to the TLS port succeeded")
		}
	})

	t.Run("JoinOverHTTPS", func(t *testing.T) {
		id := c.Join()
		select {
		case <-c.Server(id).Joined():
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not join through the https API", id)
		}
		testutil.Eventually(t, 20*time.Second, id+" replicates", func() bool {
			v, err := staleLock(c, id, "tls/a")
			return err == nil && v.Held
		})
	})

	// n3 restarted without peer TLS, then with another CA's certificates:
	// the others refuse it and it refuses them, so it learns nothing new;
	// with the right certificates it catches up.
	t.Run("WrongPeersAreRefused", func(t *testing.T) {
		right := x.Peer
		stranger := testcluster.NewTLS(t, tlsconfig.ClientAuthOptional)
		defer func() { x.Peer = right }()
		victim := "n3"
		for i, wrong := range []struct {
			name string
			cfg  *tls.Config
		}{{"plaintext", nil}, {"another CA", stranger.Peer(victim)}} {
			c.Kill(victim)
			x.Peer = func(id string) *tls.Config {
				if id == victim {
					return wrong.cfg
				}
				return right(id)
			}
			c.Start(victim)
			leader := c.WaitLeader(20 * time.Second)
			via := c.Follower()
			if via == victim {
				via = leader
			}
			name := "tls/refused-" + string(rune('a'+i))
			code, a := acquire(t, c, via, name, map[string]any{"client_id": "c1", "ttl_ms": 60000})
			if code != http.StatusOK {
				t.Fatalf("%s: the two good nodes could not commit: %d %+v", wrong.name, code, a)
			}
			// A few election timeouts: plenty for a connected node to catch up.
			time.Sleep(1500 * time.Millisecond)
			v, err := staleLock(c, victim, name)
			if err != nil {
				t.Fatalf("%s: stale read on %s: %v", wrong.name, victim, err)
			}
			if v.Held {
				t.Fatalf("%s node %s replicated %s from the TLS cluster", wrong.name, victim, name)
			}
			if st := c.Server(victim).Node.Status(); st.LeaderID != "" && st.LeaderID != victim {
				t.Fatalf("%s node %s follows leader %s", wrong.name, victim, st.LeaderID)
			}
		}
		c.Kill(victim)
		x.Peer = right
		c.Start(victim)
		testutil.Eventually(t, 20*time.Second, victim+" catches up with the right certificates", func() bool {
			v, err := staleLock(c, victim, "tls/refused-b")
			return err == nil && v.Held
		})
	})
}

func TestTLSAPIRequiresClientCertificates(t *testing.T) {
	x := testcluster.NewTLS(t, tlsconfig.ClientAuthRequire)
	c := testcluster.NewWith(t, 1, testcluster.Options{TLS: x})
	if _, err := staleLock(c, "n1", "x"); err != nil {
		t.Fatalf("https with a client certificate: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: testcluster.ClientTLS(t, x.Files, false)}}
	defer hc.CloseIdleConnections()
	if res, err := hc.Get(c.URL("n1") + "/api/v1/cluster"); err == nil {
		res.Body.Close()
		t.Fatalf("https without a client certificate: got %s, want the handshake refused", res.Status)
	}
}
