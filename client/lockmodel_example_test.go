package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock/dlock/client"
)

// At most three deploy jobs at once: a counting lock (semaphore) with three
// places. A fourth job waits in line for the first place given back.
func ExampleSemaphore() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints, ClientID: "deployer"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	deploys := c.NewSemaphore("deploys", 3, client.WithTTL(15*time.Second))
	var leases []*client.Lease
	for range 3 {
		l, err := deploys.Acquire(ctx)
		if err != nil {
			log.Fatal(err)
		}
		leases = append(leases, l)
	}
	_, err = deploys.TryAcquire(ctx)
	fmt.Println("fourth deploy refused:", errors.Is(err, client.ErrLockHeld))

	// Every client must use the lock with the same limit.
	_, err = c.NewSemaphore("deploys", 5).TryAcquire(ctx)
	var mismatch *client.APIError
	if errors.Is(err, client.ErrLimitMismatch) && errors.As(err, &mismatch) {
		fmt.Println("in use with limit", mismatch.Limit)
	}

	got := make(chan uint64)
	go func() {
		l, err := deploys.Acquire(ctx) // waits for a place
		if err != nil {
			log.Fatal(err)
		}
		got <- l.Token()
		deploys.Release(ctx, l)
	}()
	if err := deploys.Release(ctx, leases[0]); err != nil {
		log.Fatal(err)
	}
	fmt.Println("the waiting deploy got a place with a newer token:", <-got > leases[2].Token())
	for _, l := range leases[1:] {
		deploys.Release(ctx, l)
	}
	// Output:
	// fourth deploy refused: true
	// in use with limit 3
	// the waiting deploy got a place with a newer token: true
}

// Hold one of ten places on an API quota while calling it.
func ExampleClient_WithSemaphore() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.WithSemaphore(context.Background(), "quota/payments-api", 10, func(ctx context.Context, l *client.Lease) error {
		fmt.Println("calling the API under token", l.Token() > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: calling the API under token true
}

// Many readers or one writer. A writer waiting in line keeps out the
// readers that come after it, so writers are not starved.
func ExampleRWMutex() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints, ClientID: "config-service"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	cfg := c.NewRWMutex("config/main")
	r1, err := cfg.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	r2, err := cfg.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers at once")

	written := make(chan struct{})
	go func() {
		if _, err := cfg.Lock(ctx); err != nil { // waits for both readers
			log.Fatal(err)
		}
		close(written)
	}()
	// Wait until the writer is in line: then a new reader must queue
	// behind it.
	for st, err := c.Status(ctx, "config/main"); st == nil || st.Waiters == 0; st, err = c.Status(ctx, "config/main") {
		if err != nil {
			log.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = cfg.TryRLock(ctx)
	fmt.Println("a reader after the waiting writer is refused:", errors.Is(err, client.ErrLockHeld))

	cfg.RUnlock(ctx, r1)
	cfg.RUnlock(ctx, r2)
	<-written
	fmt.Println("the writer holds it alone")
	if err := cfg.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// two readers at once
	// a reader after the waiting writer is refused: true
	// the writer holds it alone
}

// A subtree lock on "billing" keeps out every job under billing/ while it
// is held, and waits for those already running.
func ExampleWithSubtree() {
	endpoints := exampleCluster()
	c, err := client.New(client.Config{Endpoints: endpoints, ClientID: "billing-admin"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	all := c.NewMutex("billing", client.WithSubtree())
	if _, err := all.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = c.NewMutex("billing/job-A").TryLock(ctx)
	var held *client.APIError
	if errors.Is(err, client.ErrLockHeld) && errors.As(err, &held) {
		fmt.Printf("billing/job-A is kept out by the subtree lock on %q\n", held.Holder.Lock)
	}
	if _, err := c.NewMutex("billing2").TryLock(ctx); err == nil {
		fmt.Println("billing2 is not under billing/")
	}
	if err := all.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// billing/job-A is kept out by the subtree lock on "billing"
	// billing2 is not under billing/
}
