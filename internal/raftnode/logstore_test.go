// Tests that both log store kinds persist logs and stable values across a
// close and reopen, and refuse a second concurrent open of one dir.

package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

var logStoreKinds = []LogStoreKind{LogStoreWAL, LogStoreBolt}

func TestOpenLogStoreReopenSeesPriorState(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) {
			dir := t.TempDir()

			store, closeFn, err := OpenLogStore(kind, dir)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			var logs []*raft.Log
			for i := uint64(1); i <= 10; i++ {
				logs = append(logs, &raft.Log{Index: i, Term: 3, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("cmd-%d", i))})
			}
			if err := store.StoreLogs(logs[:4]); err != nil {
				t.Fatalf("StoreLogs: %v", err)
			}
			if err := store.StoreLogs(logs[4:]); err != nil {
				t.Fatalf("StoreLogs: %v", err)
			}
			if err := store.SetUint64([]byte("CurrentTerm"), 3); err != nil {
				t.Fatalf("SetUint64: %v", err)
			}
			if err := store.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
				t.Fatalf("Set: %v", err)
			}
			if err := closeFn(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if err := closeFn(); err != nil {
				t.Fatalf("second close: %v", err)
			}

			store, closeFn, err = OpenLogStore(kind, dir)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer closeFn()

			first, err := store.FirstIndex()
			if err != nil || first != 1 {
				t.Fatalf("FirstIndex = %d, %v; want 1", first, err)
			}
			last, err := store.LastIndex()
			if err != nil || last != 10 {
				t.Fatalf("LastIndex = %d, %v; want 10", last, err)
			}
			for _, want := range logs {
				var got raft.Log
				if err := store.GetLog(want.Index, &got); err != nil {
					t.Fatalf("GetLog(%d): %v", want.Index, err)
				}
				if got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) {
					t.Fatalf("GetLog(%d) = %+v, want %+v", want.Index, got, want)
				}
			}
			if term, err := store.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
				t.Fatalf("GetUint64 = %d, %v; want 3", term, err)
			}
			if v, err := store.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-2" {
				t.Fatalf("Get = %q, %v; want node-2", v, err)
			}

			// Raft truncates a conflicting suffix on followers; the store
			// must accept new entries after it.
			if err := store.DeleteRange(9, 10); err != nil {
				t.Fatalf("DeleteRange suffix: %v", err)
			}
			if err := store.StoreLog(&raft.Log{Index: 9, Term: 4, Type: raft.LogCommand, Data: []byte("new")}); err != nil {
				t.Fatalf("StoreLog after truncation: %v", err)
			}
			if err := store.GetLog(10, new(raft.Log)); !errors.Is(err, raft.ErrLogNotFound) {
				t.Fatalf("GetLog(10) after truncation = %v, want raft.ErrLogNotFound", err)
			}
		})
	}
}

func TestOpenLogStoreSecondOpenFailsFast(t *testing.T) {
	for _, kind := range logStoreKinds {
		t.Run(string(kind), func(t *testing.T) {
			dir := t.TempDir()
			_, closeFn, err := OpenLogStore(kind, dir)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer closeFn()

			done := make(chan error, 1)
			go func() {
				_, c2, err := OpenLogStore(kind, dir)
				if err == nil {
					_ = c2()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("second open of a dir in use succeeded")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("second open of a dir in use blocked")
			}
		})
	}
}

func TestOpenLogStoreKinds(t *testing.T) {
	if _, _, err := OpenLogStore("rocks", t.TempDir()); err == nil {
		t.Fatal("unknown kind accepted")
	}
	store, closeFn, err := OpenLogStore("", t.TempDir())
	if err != nil {
		t.Fatalf("open default kind: %v", err)
	}
	defer closeFn()
	// raft skips log-gap repair work for monotonic stores; returning the
	// library type unwrapped must keep that visible.
	if m, ok := store.(raft.MonotonicLogStore); DefaultLogStore == LogStoreWAL && (!ok || !m.IsMonotonic()) {
		t.Fatal("WAL store does not report raft.MonotonicLogStore")
	}
}
