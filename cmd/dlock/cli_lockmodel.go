package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/dlock/dlock/client"
)

// kindFlags are the flags of dlock lock and dlock acquire that choose the
// kind of grant: a place of a counting lock, a shared grant, a subtree.
type kindFlags struct {
	limit           int
	shared, subtree bool
}

func (k *kindFlags) register(fs *pflag.FlagSet) {
	fs.IntVar(&k.limit, "limit", 1, "a counting lock (semaphore): up to N holders at once, 1 to 10000; every user of the lock must give the same N")
	fs.BoolVar(&k.shared, "shared", false, "a shared (read) grant: shared holders coexist, an exclusive one waits for them (needs --limit 1)")
	fs.BoolVar(&k.subtree, "subtree", false, "cover NAME and every name below it (NAME/...): waits for their holders, keeps new ones out")
}

func (k *kindFlags) check() error {
	switch {
	case k.limit < 1 || k.limit > client.MaxLimit:
		return usageErrorf("--limit must be between 1 and %d, got %d", client.MaxLimit, k.limit)
	case k.shared && k.limit > 1:
		return usageErrorf("--shared needs --limit 1: a counting lock is exclusive only")
	}
	return nil
}

// options are the AcquireOptions fields of the kind.
func (k *kindFlags) options(o client.AcquireOptions) client.AcquireOptions {
	o.Limit, o.Shared, o.Subtree = k.limit, k.shared, k.subtree
	return o
}

// taker is how dlock lock takes one grant of the kind and gives it back.
func (k *kindFlags) taker(c *client.Client, name string, opts []client.MutexOption) (take func(ctx context.Context, wait bool) (*client.Lease, error), give func(context.Context, *client.Lease) error) {
	if k.subtree {
		opts = append(opts, client.WithSubtree())
	}
	switch {
	case k.limit > 1:
		s := c.NewSemaphore(name, k.limit, opts...)
		return func(ctx context.Context, wait bool) (*client.Lease, error) {
			if wait {
				return s.Acquire(ctx)
			}
			return s.TryAcquire(ctx)
		}, s.Release
	case k.shared:
		rw := c.NewRWMutex(name, opts...)
		return func(ctx context.Context, wait bool) (*client.Lease, error) {
			if wait {
				return rw.RLock(ctx)
			}
			return rw.TryRLock(ctx)
		}, rw.RUnlock
	}
	m := c.NewMutex(name, opts...)
	return func(ctx context.Context, wait bool) (*client.Lease, error) {
			if wait {
				return m.Lock(ctx)
			}
			return m.TryLock(ctx)
		}, func(ctx context.Context, _ *client.Lease) error {
			return m.Unlock(ctx)
		}
}

// printStatus prints dlock status: a lock held by one exclusive holder as
// before, any other with its limit, mode and every holder.
func printStatus(st *client.LockStatus) error {
	if !st.Held {
		if !st.DelayedUntil.IsZero() {
			fmt.Printf("%s: free, in a lock-delay until %s, %d waiting\n", st.Name, showTime(st.DelayedUntil), st.Waiters)
			return nil
		}
		fmt.Printf("%s: free, %d waiting\n", st.Name, st.Waiters)
		return nil
	}
	if len(st.Holders) <= 1 && st.Limit <= 1 && st.Mode != client.ModeShared && !st.Subtree {
		fmt.Printf("%s: held by %s\nfencing_token  %d\ngranted_at     %s\nexpires_at     %s\nwaiting        %d\n",
			st.Name, st.Holder.ClientID, st.Holder.FencingToken, showTime(st.Holder.GrantedAt), showTime(st.Holder.ExpiresAt), st.Waiters)
		if st.Value != "" {
			fmt.Printf("value          %s\n", st.Value)
		}
		return nil
	}
	fmt.Printf("%s: held by %d (%s, limit %d), %d waiting\n", st.Name, len(st.Holders), st.Mode, st.Limit, st.Waiters)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOLDER\tTOKEN\tMODE\tSUBTREE\tGRANTED\tEXPIRES")
	for _, h := range st.Holders {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\n", h.ClientID, strconv.FormatUint(h.FencingToken, 10), h.Mode, h.Subtree, showTime(h.GrantedAt), showTime(h.ExpiresAt))
	}
	return tw.Flush()
}
