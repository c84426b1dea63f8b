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
