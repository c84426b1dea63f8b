package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/client"
	"github.com/dlock/dlock/internal/testcluster"
)

// fencedStore stands for the resource a lock protects: it remembers the
// highest fencing token it has seen and refuses writes with older ones, so a
// holder that paused past its lease cannot overwrite its successor's work.
type fencedStore struct {
	mu      sync.Mutex
	highest uint64
	data    map[string]string
}

var errStaleToken = errors.New("stale fencing token")

func (s *fencedStore) Write(ctx context.Context, token uint64, key, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return errStaleToken
	}
	s.highest = token
	if s.data == nil {
		s.data = map[string]string{}
	}
	s.data[key] = value
	return nil
}

// A worker that writes a report while holding a lock, and passes the
// fencing token along with the write.
func ExampleClient_WithLock() {
	endpoints := exampleCluster() // e.g. []string{"http://127.0.0.1:7070", "http://127.0.0.1:7080", "http://127.0.0.1:7090"}
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	store := &fencedStore{}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.WithLock(ctx, "reports/daily", func(ctx context.Context, l *client.Lease) error {
		// ctx is cancelled if the lease is lost; the store refuses the write
		// if a newer holder has written since.
		return store.Write(ctx, l.Token(), "daily", "42 orders")
	}, client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("report written:", store.data["daily"])
	// Output: report written: 42 orders
}

func ExampleMutex_TryLock() {
	endpoints := exampleCluster()
	alice, _ := client.New(client.Config{Endpoints: endpoints, ClientID: "alice"})
	bob, _ := client.New(client.Config{Endpoints: endpoints, ClientID: "bob"})
	defer alice.Close()
	defer bob.Close()
	ctx := context.Background()

	m := alice.NewMutex("printer")
	if _, err := m.TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	_, err := bob.NewMutex("printer").TryLock(ctx)
	var held *client.APIError
	if errors.Is(err, client.ErrLockHeld) && errors.As(err, &held) {
		fmt.Println("bob: busy, held by", held.Holder.ClientID)
	}
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	l, err := bob.NewMutex("printer").TryLock(ctx)
	fmt.Println("bob: got it:", err == nil && l.Err() == nil)
	// Output:
	// bob: busy, held by alice
	// bob: got it: true
}

func ExampleMutex_Lock() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	m := c.NewMutex("billing/batch-job", client.WithTTL(15*time.Second))
	// Wait in line for at most 30 s.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := m.Lock(ctx)
	if errors.Is(err, client.ErrWaitTimeout) {
		fmt.Println("someone else is still running the batch job")
		return
	} else if err != nil {
		log.Fatal(err)
	}
	defer m.Unlock(context.Background())

	select {
	case <-l.Done():
		fmt.Println("lock lost:", l.Err())
	case <-time.After(100 * time.Millisecond): // the work
		fmt.Println("batch job done under token", l.Token() > 0)
	}
	// Output: batch job done under token true
}

func ExampleClient_NewSession() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	// One keepalive for every lock this worker holds.
	s, err := c.NewSession(ctx, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, shard := range []string{"shards/1", "shards/2", "shards/3"} {
		if _, err := c.NewMutex(shard, client.WithSession(s)).TryLock(ctx); err != nil {
			log.Fatal(err)
		}
	}
	st, _ := c.List(ctx, "shards/")
	fmt.Println("holding", len(st), "shards")
	// Closing the session releases them all.
	if err := s.Close(ctx); err != nil {
		log.Fatal(err)
	}
	st, _ = c.List(ctx, "shards/")
	fmt.Println("holding", len(st), "shards")
	// Output:
	// holding 3 shards
	// holding 0 shards
}

// A leader-elected singleton: of all the processes running this, one at a
// time does the scheduling; when it stops or dies, the next in line takes over.
func ExampleElection_Campaign() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := &fencedStore{}

	e := c.NewElection("reports/scheduler", client.WithTTL(10*time.Second))
	lead, err := e.Campaign(ctx, "scheduler-1") // waits in line until elected
	if err != nil {
		log.Fatal(err)
	}
	defer lead.Resign(context.Background()) // the next in line takes over at once
	for round := 1; round <= 3; round++ {
		select {
		case <-lead.Done(): // leadership may be lost: stop acting as leader
			log.Fatal(lead.Err())
		case <-time.After(10 * time.Millisecond): // the leader's periodic work
			// The token fences off writes of a leader that paused past its term.
			if err := store.Write(ctx, lead.Token(), "schedule", fmt.Sprint("round ", round)); err != nil {
				log.Fatal(err)
			}
		}
	}
	leader, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Value, "wrote", store.data["schedule"])
	// Output: leader: scheduler-1 wrote round 3
}

// Observe reports every leader and every vacancy.
func ExampleElection_Observe() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	e := c.NewElection("db/primary")
	var lead *client.Leadership
	for view, err := range e.Observe(ctx) {
		if err != nil {
			log.Fatal(err)
		}
		if view.Leader == nil {
			fmt.Println("no leader")
		} else {
			fmt.Println("leader:", view.Leader.Value)
		}
		switch {
		case lead == nil: // run for it
			if lead, err = e.Campaign(ctx, "db-1"); err != nil {
				log.Fatal(err)
			}
		case lead.Err() == nil: // step down
			if err := lead.Resign(ctx); err != nil {
				log.Fatal(err)
			}
		default:
			return
		}
	}
	// Output:
	// no leader
	// leader: db-1
	// no leader
}

// List, then watch from the listed revision + 1: every change after the
// listing, exactly once, also across reconnects to other nodes.
func ExampleClient_Watch() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	locks, rev, err := c.ListWithRevision(ctx, "jobs/")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held now:", len(locks))
	go func() { // someone takes and releases a lock
		_ = c.WithLock(ctx, "jobs/nightly", func(context.Context, *client.Lease) error { return nil })
	}()
	seen := 0
	for ev, err := range c.Watch(ctx, "jobs/", rev+1) {
		if errors.Is(err, client.ErrCompacted) {
			log.Fatal("fell too far behind: list again and watch from there")
		} else if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Type, ev.Name)
		if seen++; seen == 2 {
			break
		}
	}
	// Output:
	// held now: 0
	// acquired jobs/nightly
	// released jobs/nightly
}

// The examples share one throwaway cluster, started on first use and
// stopped by TestMain.
var (
	exampleOnce     sync.Once
	exampleTB       *fakeTB
	exampleEndpoint []string
)

func exampleCluster() []string {
	exampleOnce.Do(func() {
		exampleTB = &fakeTB{}
		tc := testcluster.New(exampleTB, 3)
		for _, id := range tc.IDs() {
			exampleEndpoint = append(exampleEndpoint, tc.URL(id))
		}
	})
	return exampleEndpoint
}

func stopExampleCluster() {
	if exampleTB != nil {
		exampleTB.cleanup()
	}
}

// fakeTB lets examples, which get no *testing.T, start a test cluster. It
// implements the methods testcluster uses; the embedded nil interface
// supplies testing.TB's unexported method and would panic on any other.
type fakeTB struct {
	testing.TB
	cleanups []func()
}

func (f *fakeTB) Helper()                   {}
func (f *fakeTB) Cleanup(fn func())         { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(string, ...any)       {}
func (f *fakeTB) Fatalf(s string, a ...any) { panic(fmt.Sprintf(s, a...)) }
func (f *fakeTB) TempDir() string {
	dir, err := os.MkdirTemp("", "dlock-example-")
	if err != nil {
		panic(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}
