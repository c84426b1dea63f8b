package service

import (
	"context"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/apierror"
)

// The lock model through the service: validation before anything is
// proposed, the refusals' codes and fields, and the lock view's holders.
func TestLockModelAnswers(t *testing.T) {
	ctx := context.Background()
	_, s := keyedService(t)
	acq := func(client, name string, limit int64, mode string, subtree bool) (*AcquireResponse, error) {
		return s.Acquire(ctx, AcquireRequest{Name: name, ClientID: client, TTLms: 30_000, Limit: limit, Mode: mode, Subtree: subtree})
	}
	for _, bad := range []AcquireRequest{
		{Mode: "read"}, {Limit: -1}, {Limit: 10_001}, {Limit: 3, Mode: ModeShared},
	} {
		bad.Name, bad.ClientID, bad.TTLms = "x", "c", 30_000
		if _, err := s.Acquire(ctx, bad); apierror.CodeOf(err) != apierror.InvalidArgument {
			t.Errorf("%+v: %v, want invalid_argument", bad, err)
		}
	}
	for _, c := range []string{"a", "b"} {
		if _, err := acq(c, "sem", 2, "", false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := acq("c", "sem", 2, "", false); apierror.CodeOf(err) != apierror.LockHeld {
		t.Fatalf("a third place of limit 2: %v", err)
	}
	resp, err := acq("c", "sem", 3, "", false)
	if apierror.CodeOf(err) != apierror.LimitMismatch || resp == nil || resp.Limit != 2 {
		t.Fatalf("another limit: %+v %v", resp, err)
	}
	v, err := s.GetLock(ctx, "sem", false)
	if err != nil || v.Limit != 2 || v.Mode != ModeExclusive || len(v.Holders) != 2 || v.Holder.ClientID != "a" || v.Holders[1].ClientID != "b" {
		t.Fatalf("GetLock: %+v %v", v, err)
	}
	// A refusal through a subtree names the lock in the way and the mode.
	if _, err := acq("r", "tree", 0, ModeShared, true); err != nil {
		t.Fatal(err)
	}
	resp, err = acq("w", "tree/a/b", 0, "", false)
	if apierror.CodeOf(err) != apierror.LockHeld || resp == nil || resp.Holder == nil || resp.Holder.Lock != "tree" ||
		resp.Holder.Mode != ModeShared || !resp.Holder.Subtree || !strings.Contains(err.Error(), `through "tree"`) {
		t.Fatalf("through a subtree: %+v %v", resp, err)
	}
	if _, err := acq("r2", "tree/a", 0, ModeShared, false); err != nil {
		t.Fatalf("a shared grant inside a shared subtree: %v", err)
	}
	list, err := s.ListLocks(ctx, ListRequest{Prefix: "tree"})
	if err != nil || len(list.Locks) != 2 || !list.Locks[0].Subtree || list.Locks[1].Mode != ModeShared {
		t.Fatalf("ListLocks: %+v %v", list, err)
	}
}
