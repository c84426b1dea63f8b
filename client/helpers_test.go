package client_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopExampleCluster()
	os.Exit(code)
}

// cluster is a real 3-node in-process cluster and its endpoints.
type cluster struct {
	*testcluster.Cluster
	t         testing.TB
	endpoints []string
}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	tc := testcluster.New(t, 3)
	c := &cluster{Cluster: tc, t: t}
	for _, id := range tc.IDs() {
		c.endpoints = append(c.endpoints, tc.URL(id))
	}
	return c
}

// client returns a client of the cluster that is closed at test cleanup.
func (c *cluster) client(id string, tune ...func(*client.Config)) *client.Client {
	c.t.Helper()
	cfg := client.Config{Endpoints: c.endpoints, ClientID: id, RequestTimeout: 2 * time.Second}
	for _, f := range tune {
		f(&cfg)
	}
	cl, err := client.New(cfg)
	if err != nil {
		c.t.Fatalf("client.New: %v", err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// get reads a lock straight over HTTP from a running node, independently
// of the client under test.
func (c *cluster) get(name string) client.LockStatus {
	c.t.Helper()
	var st client.LockStatus
	testutil.Eventually(c.t, 10*time.Second, "read lock "+name+" from a running node", func() (bool, string) {
		var why string
		for _, id := range c.Running() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			code, err := c.Do(ctx, http.MethodGet, c.URL(id)+"/api/v1/locks/"+name, nil, &st)
			cancel()
			if err == nil && code == http.StatusOK {
				return true, ""
			}
			why = fmt.Sprintf("GET on %s: status %d, %v", id, code, err)
		}
		return false, why
	})
	return st
}

// lastToken is the last fencing token the leader granted.
func (c *cluster) lastToken() uint64 {
	c.t.Helper()
	leader := c.WaitLeader(10 * time.Second)
	var ci client.ClusterInfo
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if code, err := c.Do(ctx, http.MethodGet, c.URL(leader)+"/api/v1/cluster", nil, &ci); err != nil || code != http.StatusOK {
		c.t.Fatalf("GET /cluster: %d %v", code, err)
	}
	return ci.LastFencingToken
}

func (c *cluster) killAll() {
	for _, id := range c.Running() {
		c.Kill(id)
	}
}

func (c *cluster) leaderURL() string {
	return c.URL(c.WaitLeader(10 * time.Second))
}

func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Host
}

func checkHeld(t testing.TB, st client.LockStatus, clientID string, token uint64) {
	t.Helper()
	if !st.Held || st.Holder == nil || st.Holder.ClientID != clientID || st.Holder.FencingToken != token {
		t.Fatalf("lock %q: want held by %s with token %d, got %+v holder %+v", st.Name, clientID, token, st, st.Holder)
	}
}

func checkFree(t testing.TB, st client.LockStatus) {
	t.Helper()
	if st.Held || st.Waiters != 0 {
		t.Fatalf("lock %q: want free with no waiters, got %+v holder %+v", st.Name, st, st.Holder)
	}
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func joinLines(lines []string) string { return strings.Join(lines, "\n") }
