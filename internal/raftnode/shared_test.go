package raftnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

func openTestShared(t *testing.T) (*Shared, string) {
	t.Helper()
	addr := freeRaftAddr(t)
	s, err := OpenShared(SharedConfig{DataDir: t.TempDir(), RaftAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, addr
}

// A routed call's body leaves the sender only once the receiving handler
// starts reading it. A receiver that does not within the accept bound (a
// paused process, here a handler that has not started) never gets the
// body, even when it reads it later: the sender may give the call to
// another node. A call whose body was read and whose answer was then lost
// is reported as such, not as unsent.
func TestRoutedCallSendsItsBodyOnlyWhenAccepted(t *testing.T) {
	a, _ := openTestShared(t)
	b, bAddr := openTestShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	type seen struct {
		body string
		err  error
	}
	paused := make(chan struct{})
	got, late := make(chan seen, 8), make(chan seen, 1)
	mode := make(chan string, 8) // one entry per call: how the handler behaves
	b.HandleRoute(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch <-mode {
		case "paused":
			<-paused
			body, err := io.ReadAll(r.Body)
			late <- seen{string(body), err}
			return
		case "lose":
			body, err := io.ReadAll(r.Body)
			got <- seen{string(body), err}
			conn, _, herr := http.NewResponseController(w).Hijack()
			if herr != nil {
				t.Errorf("hijack: %v", herr)
				return
			}
			_ = conn.Close() // ran the call; the answer is lost
			return
		}
		body, err := io.ReadAll(r.Body)
		got <- seen{string(body), err}
		_, _ = w.Write(append([]byte("echo "), body...))
	}))

	// A healthy receiver answers within the bound.
	mode <- "echo"
	out, status, err := a.Call(ctx, bAddr, RoutePrefix+"call", []byte("one"), time.Second)
	if err != nil || status != http.StatusOK || string(out) != "echo one" {
		t.Fatalf("call: %q %d %v", out, status, err)
	}
	if s := <-got; s.body != "one" || s.err != nil {
		t.Fatalf("the receiver read %+v", s)
	}

	// A paused receiver: the call is abandoned unsent after the bound.
	mode <- "paused"
	_, _, err = a.Call(ctx, bAddr, RoutePrefix+"call", []byte("two"), 200*time.Millisecond)
	if !errors.Is(err, ErrNotAccepted) || !errors.Is(err, ErrNotSent) {
		t.Fatalf("a call to a paused receiver: %v, want ErrNotAccepted and ErrNotSent", err)
	}
	// Once it resumes, it finds no call to run.
	close(paused)
	if s := <-late; s.body == "two" || s.err == nil {
		t.Fatalf("the resumed receiver read %+v, want no body and an error", s)
	}
	mode <- "echo"
	if out, _, err := a.Call(ctx, bAddr, RoutePrefix+"call", []byte("three"), 0); err != nil || string(out) != "echo three" {
		t.Fatalf("call after the pause: %q %v", out, err)
	}
	if s := <-got; s.body != "three" {
		t.Fatalf("the receiver read %+v, want the third call", s)
	}

	// The receiver reads the call, then the connection breaks: not unsent.
	mode <- "lose"
	_, _, err = a.Call(ctx, bAddr, RoutePrefix+"call", []byte("four"), time.Second)
	if err == nil || errors.Is(err, ErrNotSent) {
		t.Fatalf("a call whose answer was lost: %v, want an error that is not ErrNotSent", err)
	}
	if s := <-got; s.body != "four" {
		t.Fatalf("the receiver read %+v", s)
	}

	// Nobody listening: unsent, and not a timeout.
	_, _, err = a.Call(ctx, freeRaftAddr(t), RoutePrefix+"call", []byte("five"), time.Second)
	if !errors.Is(err, ErrNotSent) || errors.Is(err, ErrNotAccepted) {
		t.Fatalf("a call to a closed port: %v, want ErrNotSent only", err)
	}
	select {
	case s := <-got:
		t.Fatalf("a handler read %+v after the checks", s)
	default:
	}
}

// BenchmarkRoutedCall is one routed call's round trip between two nodes'
// raft ports, as Call sends it (the body withheld until the receiver reads
// it) and as a plain POST would.
func BenchmarkRoutedCall(b *testing.B) {
	a, err := OpenShared(SharedConfig{DataDir: b.TempDir(), RaftAddr: freeRaftAddr(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	addr := freeRaftAddr(b)
	r, err := OpenShared(SharedConfig{DataDir: b.TempDir(), RaftAddr: addr})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	r.HandleRoute(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		_, _ = w.Write(body)
	}))
	body := []byte(`{"group":1,"op":"acquire","name":"bench","req":{"client_id":"b","ttl_ms":60000}}`)
	ctx := context.Background()
	b.Run("call", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := a.Call(ctx, addr, RoutePrefix+"call", body, time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+RoutePrefix+"call", bytes.NewReader(body))
			res, err := a.client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	})
}

// TestDeleteGroupRemovesItsSnapshotFiles: a group moved off the node leaves
// no records and no snapshot file behind; the other groups keep theirs.
func TestDeleteGroupRemovesItsSnapshotFiles(t *testing.T) {
	s, _ := openTestShared(t)
	for _, g := range []uint64{5, 6} {
		if err := s.store.Save(g, raftpb.HardState{Term: 1, Commit: 3}, nil, testSnap(3, 1, 1000), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteGroup(5); err != nil {
		t.Fatal(err)
	}
	if got := snapFiles(t, s.store.dir); len(got) != 1 || got[0] != snapFileName(6, testSnap(3, 1, 0).Metadata) {
		t.Fatalf("snapshot files after deleting group 5: %v, want only group 6's", got)
	}
	if gs, err := s.store.Load(5); err != nil || !raft.IsEmptySnap(gs.Snapshot) {
		t.Fatalf("group 5 after its deletion: %v, %v", gs.Snapshot.Metadata, err)
	}
	if gs, err := s.store.Load(6); err != nil || len(gs.Snapshot.Data) != 1000 {
		t.Fatalf("group 6 after group 5's deletion: %d bytes, %v", len(gs.Snapshot.Data), err)
	}
}
