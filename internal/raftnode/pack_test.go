package raftnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/raft"

	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/command"
	"github.com/dlock/dlock/internal/fsm"
)

// fakeFuture is an apply future the test answers by hand.
type fakeFuture struct {
	data    []byte
	timeout time.Duration
	answer  chan struct{}
	err     error
	resp    any
}

func (f *fakeFuture) Error() error {
	<-f.answer
	return f.err
}
func (f *fakeFuture) Response() any  { return f.resp }
func (f *fakeFuture) Index() uint64  { return 0 }
func (f *fakeFuture) done(err error) { f.err = err; close(f.answer) }

// fakeRaft records what the packer proposes, and counts its barriers.
type fakeRaft struct {
	mu       sync.Mutex
	proposed []*fakeFuture
	barriers int
}

func (r *fakeRaft) barrier(timeout time.Duration) raft.Future {
	r.mu.Lock()
	r.barriers++
	r.mu.Unlock()
	f := &fakeFuture{answer: make(chan struct{})}
	f.done(nil)
	return f
}

// barriersAfter lets fake time pass (everyone else blocked) and returns
// how many barriers went out in all.
func (r *fakeRaft) barriersAfter(d time.Duration) int {
	time.Sleep(d)
	synctest.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.barriers
}

func (r *fakeRaft) apply(data []byte, timeout time.Duration) raft.ApplyFuture {
	f := &fakeFuture{data: data, timeout: timeout, answer: make(chan struct{})}
	r.mu.Lock()
	r.proposed = append(r.proposed, f)
	r.mu.Unlock()
	return f
}

// settled waits until every goroutine of the test's bubble is blocked (the
// packer and the writers have done all they can) and returns the entries
// proposed so far; there must be want of them.
func (r *fakeRaft) settled(t *testing.T, want int) []*fakeFuture {
	t.Helper()
	synctest.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.proposed) != want {
		t.Fatalf("%d entries proposed, want %d", len(r.proposed), want)
	}
	return append([]*fakeFuture(nil), r.proposed...)
}

// answerAll answers an entry as the FSM would: one Response per command, in
// order, each carrying its command's request id (Result.Message) so a test
// can tell whose answer a caller got, and the Seq of its place in entry 7.
func answerAll(t *testing.T, f *fakeFuture) {
	t.Helper()
	envs, packed, err := command.DecodeEntry(f.data)
	if err != nil {
		t.Fatalf("the packer proposed an undecodable entry: %v", err)
	}
	resps := make([]fsm.Response, len(envs))
	for i, e := range envs {
		resps[i] = fsm.Response{Index: 7, Seq: command.Seq(7, i), Result: command.Result{Message: e.RequestID}}
	}
	if packed {
		f.resp = resps
	} else {
		f.resp = &resps[0]
	}
	f.done(nil)
}

// startPacker runs a packer over a fakeRaft until the test ends. Call it
// inside a synctest bubble.
func startPacker(t *testing.T, inFlight int) (*packer, *fakeRaft) {
	t.Helper()
	return startLingeringPacker(t, inFlight, 0)
}

// startLingeringPacker is startPacker with the packer's linger.
func startLingeringPacker(t *testing.T, inFlight int, linger time.Duration) (*packer, *fakeRaft) {
	t.Helper()
	r := &fakeRaft{}
	stop := make(chan struct{})
	p := newPacker(r.apply, r.barrier, inFlight, time.Millisecond, linger, stop)
	done := make(chan struct{})
	go func() { defer close(done); p.run() }()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return p, r
}

func encodedRequest(id string) []byte {
	return command.Encode(&command.Envelope{ClientID: "c", RequestID: id, Body: &command.Tick{}})
}

// submitEach submits one request per id, in order (submitAsync).
func submitEach(ctx context.Context, p *packer, ids ...string) []chan submitted {
	chs := make([]chan submitted, len(ids))
	for i, id := range ids {
		chs[i] = submitAsync(ctx, p, encodedRequest(id))
	}
	return chs
}

type submitted struct {
	resp *fsm.Response
	err  error
}

// submitAsync submits data from a new goroutine and waits until it can go
// no further (answered, or queued behind the others: arrival order).
func submitAsync(ctx context.Context, p *packer, data []byte) chan submitted {
	ch := make(chan submitted, 1)
	go func() {
		resp, err := p.submit(ctx, data)
		ch <- submitted{resp, err}
	}()
	synctest.Wait()
	return ch
}

// While every slot is taken, later writes wait and then go out together, in
// arrival order, as one packed entry; each caller gets its own command's
// answer.
func TestPackerPacksWhileSlotsAreTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := startPacker(t, 1)
		ctx := context.Background()
		first := submitAsync(ctx, p, encodedRequest("a"))
		f1 := r.settled(t, 1)[0]
		if _, packed, _ := command.DecodeEntry(f1.data); packed {
			t.Fatal("a lone write was packed; want it proposed as it is")
		}
		var later []chan submitted
		for i := range 5 {
			later = append(later, submitAsync(ctx, p, encodedRequest(fmt.Sprintf("b%d", i))))
		}
		r.settled(t, 1) // the only slot is taken: nothing more goes out
		answerAll(t, f1)
		if s := <-first; s.err != nil || s.resp.Result.Message != "a" {
			t.Fatalf("first write: %+v, %v", s.resp, s.err)
		}
		f2 := r.settled(t, 2)[1]
		envs, packed, err := command.DecodeEntry(f2.data)
		if err != nil || !packed || len(envs) != 5 {
			t.Fatalf("second entry: %d commands, packed %v, %v; want the 5 that waited, packed", len(envs), packed, err)
		}
		for i, e := range envs {
			if want := fmt.Sprintf("b%d", i); e.RequestID != want {
				t.Fatalf("command %d of the packed entry is %q, want %q (arrival order)", i, e.RequestID, want)
			}
		}
		answerAll(t, f2)
		for i, ch := range later {
			s := <-ch
			if want := fmt.Sprintf("b%d", i); s.err != nil || s.resp.Result.Message != want || s.resp.Seq != command.Seq(7, i) {
				t.Fatalf("write %s: %+v, %v; want its own answer", want, s.resp, s.err)
			}
		}
		if e, c := p.entries.Load(), p.commands.Load(); e != 2 || c != 6 {
			t.Fatalf("counters: %d entries, %d commands; want 2 and 6", e, c)
		}
	})
}

// With room for two entries, a second goes out beside the first only while
// the one under commit carries a lone write (light load: latency first);
// beside an entry of several writes (load: pack more), it waits.
func TestPackerPipelinesOnlyBesideLoneWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := startPacker(t, 2)
		ctx := context.Background()
		a := submitAsync(ctx, p, encodedRequest("a"))
		b := submitAsync(ctx, p, encodedRequest("b"))
		fs := r.settled(t, 2) // b went out beside the lone a
		cde := submitEach(ctx, p, "c", "d", "e")
		r.settled(t, 2) // two under commit: c, d, e wait
		answerAll(t, fs[0])
		if s := <-a; s.err != nil || s.resp.Result.Message != "a" {
			t.Fatalf("a: %+v, %v", s.resp, s.err)
		}
		fs = r.settled(t, 3) // b is lone: c, d, e go out beside it, packed
		if envs, packed, _ := command.DecodeEntry(fs[2].data); !packed || len(envs) != 3 {
			t.Fatalf("the third entry carries %d writes; want c, d, e packed", len(envs))
		}
		f := submitAsync(ctx, p, encodedRequest("f"))
		answerAll(t, fs[1])
		if s := <-b; s.err != nil || s.resp.Result.Message != "b" {
			t.Fatalf("b: %+v, %v", s.resp, s.err)
		}
		r.settled(t, 3) // only c, d, e under commit, but packed: f waits
		answerAll(t, fs[2])
		for i, ch := range cde {
			if s := <-ch; s.err != nil || s.resp.Result.Message != string(rune('c'+i)) {
				t.Fatalf("%c: %+v, %v", 'c'+i, s.resp, s.err)
			}
		}
		answerAll(t, r.settled(t, 4)[3])
		if s := <-f; s.err != nil || s.resp.Result.Message != "f" {
			t.Fatalf("f: %+v, %v", s.resp, s.err)
		}
	})
}

// Once lone writes come in pairs (a contended lock's hand-off), the next lone
// write waits up to the linger for its partner and both share one entry; a
// write that waits in vain goes out alone after the linger, and the next lone
// write does not wait at all; writes far apart never wait.
func TestPackerLingersForPairs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const linger = 100 * time.Microsecond
		p, r := startLingeringPacker(t, 2, linger)
		ctx := context.Background()
		// Far apart: each goes out alone at once.
		a := submitAsync(ctx, p, encodedRequest("a"))
		answerAll(t, r.settled(t, 1)[0])
		<-a
		time.Sleep(time.Millisecond)
		b := submitAsync(ctx, p, encodedRequest("b"))
		answerAll(t, r.settled(t, 2)[1])
		<-b
		if n := p.lingers.Load(); n != 0 {
			t.Fatalf("writes a millisecond apart lingered %d times", n)
		}
		time.Sleep(time.Millisecond)
		// A pair, each alone in its entry: the pattern is seen.
		cd := submitEach(ctx, p, "c", "d")
		fs := r.settled(t, 4)
		answerAll(t, fs[2])
		answerAll(t, fs[3])
		<-cd[0]
		<-cd[1]
		// The next lone write waits for its partner: one entry carries both.
		start := time.Now()
		e := submitAsync(ctx, p, encodedRequest("e"))
		r.settled(t, 4) // e waits
		time.Sleep(linger / 2)
		f := submitAsync(ctx, p, encodedRequest("f"))
		fs = r.settled(t, 5)
		if envs, packed, _ := command.DecodeEntry(fs[4].data); !packed || len(envs) != 2 {
			t.Fatalf("the paired writes went out as %d in one entry (packed %v), want e and f together", len(envs), packed)
		}
		if waited := time.Since(start); waited >= linger {
			t.Fatalf("e went out after %v; want when f came (%v)", waited, linger/2)
		}
		answerAll(t, fs[4])
		<-e
		<-f
		// A lone write that waits in vain goes out after the linger ...
		g := submitAsync(ctx, p, encodedRequest("g"))
		r.settled(t, 5)
		time.Sleep(linger)
		answerAll(t, r.settled(t, 6)[5])
		<-g
		// ... and the next lone write does not wait.
		h := submitAsync(ctx, p, encodedRequest("h"))
		answerAll(t, r.settled(t, 7)[6])
		<-h
		if n := p.lingers.Load(); n != 2 {
			t.Fatalf("%d lingers, want 2 (e's and g's)", n)
		}
	})
}

// An entry never exceeds command.MaxPacked commands or command.MaxEntryBytes:
// what does not fit waits for the next entry.
func TestPackerKeepsEntriesWithinBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(p *packer)
		want string
	}{
		{"commands", func(p *packer) { p.maxCmds = 3 }, "[3 3 1]"},
		{"bytes", func(p *packer) { p.maxBytes = 2*len(encodedRequest("y0")) + command.PackedOverhead(2) }, "[2 2 2 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, r := startPacker(t, 1)
				tc.set(p)
				ctx := context.Background()
				first := submitAsync(ctx, p, encodedRequest("x"))
				var later []chan submitted
				for i := range 7 {
					later = append(later, submitAsync(ctx, p, encodedRequest(fmt.Sprintf("y%d", i))))
				}
				answerAll(t, r.settled(t, 1)[0])
				<-first
				var sizes []int
				for n := 2; len(sizes) == 0 || sum(sizes) < 7; n++ {
					f := r.settled(t, n)[n-1]
					envs, _, err := command.DecodeEntry(f.data)
					if err != nil {
						t.Fatal(err)
					}
					if len(f.data) > p.maxBytes {
						t.Fatalf("an entry of %d bytes with a bound of %d", len(f.data), p.maxBytes)
					}
					sizes = append(sizes, len(envs))
					answerAll(t, f)
				}
				if fmt.Sprint(sizes) != tc.want {
					t.Fatalf("7 waiting writes went out in entries of %v commands; want %s", sizes, tc.want)
				}
				for _, ch := range later {
					if s := <-ch; s.err != nil {
						t.Fatal(s.err)
					}
				}
			})
		})
	}
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

// Raft's answer for an entry is every command's answer: certainly not
// appended is retriable, appended but not known to be committed is unknown.
func TestPackerPassesRaftErrorsToEveryCommand(t *testing.T) {
	for _, tc := range []struct {
		raftErr error
		want    error
		code    apierror.Code
	}{
		{raft.ErrNotLeader, errRetry, ""},
		{raft.ErrEnqueueTimeout, errRetry, ""},
		{raft.ErrLeadershipLost, errUnknown, ""},
		{raft.ErrRaftShutdown, nil, apierror.Unavailable},
	} {
		t.Run(tc.raftErr.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, r := startPacker(t, 1)
				ctx := context.Background()
				writes := submitEach(ctx, p, "a", "b", "c")
				r.settled(t, 1)[0].done(tc.raftErr)
				r.settled(t, 2)[1].done(tc.raftErr)
				for _, ch := range writes {
					s := <-ch
					switch {
					case tc.want != nil && !errors.Is(s.err, tc.want):
						t.Fatalf("Raft said %v; a command got %v, want %v", tc.raftErr, s.err, tc.want)
					case tc.code != "" && apierror.CodeOf(s.err) != tc.code:
						t.Fatalf("Raft said %v; a command got %v, want code %s", tc.raftErr, s.err, tc.code)
					}
				}
			})
		})
	}
}

// shortDeadlineCtx has a deadline but never closes Done: the state of a
// stdlib context between its deadline and the moment its timer fires.
type shortDeadlineCtx struct {
	context.Context
	d time.Time
}

func (c shortDeadlineCtx) Deadline() (time.Time, bool) { return c.d, true }

// A write whose deadline passed while it waited for a slot is not proposed:
// its caller is told it is safe to retry. The entry's Raft timeout is the
// shortest time any of its writes has left.
func TestPackerDropsExpiredWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := startPacker(t, 1)
		first := submitAsync(context.Background(), p, encodedRequest("a"))
		expired := submitAsync(shortDeadlineCtx{context.Background(), time.Now().Add(20 * time.Millisecond)}, p, encodedRequest("late"))
		soon := submitAsync(shortDeadlineCtx{context.Background(), time.Now().Add(time.Second)}, p, encodedRequest("b"))
		live := submitAsync(context.Background(), p, encodedRequest("c"))
		time.Sleep(50 * time.Millisecond)
		answerAll(t, r.settled(t, 1)[0])
		<-first
		if s := <-expired; !errors.Is(s.err, errRetry) {
			t.Fatalf("a write past its deadline: %+v, %v; want errRetry (not proposed)", s.resp, s.err)
		}
		f2 := r.settled(t, 2)[1]
		envs, _, _ := command.DecodeEntry(f2.data)
		if len(envs) != 2 || envs[0].RequestID != "b" || envs[1].RequestID != "c" {
			t.Fatalf("the next entry carries %d commands; want only the two live ones", len(envs))
		}
		if want := 950 * time.Millisecond; f2.timeout != want {
			t.Fatalf("proposed with Raft timeout %v; want %v, the shortest time left", f2.timeout, want)
		}
		answerAll(t, f2)
		for _, ch := range []chan submitted{soon, live} {
			if s := <-ch; s.err != nil {
				t.Fatal(s.err)
			}
		}
	})
}

// An answer of the wrong shape is an error for every command, never a
// response handed to the wrong caller.
func TestPackerRejectsMismatchedAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := startPacker(t, 1)
		ctx := context.Background()
		writes := submitEach(ctx, p, "a", "b", "c")
		answerAll(t, r.settled(t, 1)[0])
		<-writes[0]
		f2 := r.settled(t, 2)[1]
		f2.resp = []fsm.Response{{Index: 1}} // one answer for two commands
		f2.done(nil)
		for _, ch := range writes[1:] {
			if s := <-ch; s.err == nil {
				t.Fatalf("a command of a two-command entry answered with one response got %+v", s.resp)
			}
		}
	})
}

// Once writes stop, the last commit is announced with one barrier after the
// notice delay, and only then: not while a later write is on its way (its
// entry carries the news), not again while idle. An entry that failed also
// ends with one: it may never have reached the log to carry an earlier
// commit's news. (The packers here use a 1 ms delay.)
func TestPackerAnnouncesTheLastCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := startPacker(t, 2)
		ctx := context.Background()
		a := submitAsync(ctx, p, encodedRequest("a"))
		answerAll(t, r.settled(t, 1)[0])
		<-a
		if n := r.barriersAfter(500 * time.Microsecond); n != 0 {
			t.Fatalf("%d barriers before the delay passed", n)
		}
		b := submitAsync(ctx, p, encodedRequest("b")) // carries a's commit
		if n := r.barriersAfter(time.Millisecond); n != 0 {
			t.Fatalf("%d barriers while b is under commit", n)
		}
		answerAll(t, r.settled(t, 2)[1])
		<-b
		if n := r.barriersAfter(time.Millisecond); n != 1 {
			t.Fatalf("%d barriers after b committed and the writes stopped; want 1", n)
		}
		if n := r.barriersAfter(time.Second); n != 1 {
			t.Fatalf("%d barriers after a quiet second; want still 1", n)
		}

		c := submitAsync(ctx, p, encodedRequest("c"))
		r.settled(t, 3)[2].done(raft.ErrLeadershipLost)
		<-c
		if n := r.barriersAfter(time.Second); n != 2 {
			t.Fatalf("%d barriers after an entry that failed; want 2", n)
		}

		// Two entries under commit: the first one's commit waits for the
		// second's answer (which would carry it), then both are announced.
		d := submitAsync(ctx, p, encodedRequest("d"))
		e := submitAsync(ctx, p, encodedRequest("e"))
		fs := r.settled(t, 5)
		answerAll(t, fs[3])
		<-d
		if n := r.barriersAfter(time.Second); n != 2 {
			t.Fatalf("%d barriers while e is still under commit; want still 2", n)
		}
		answerAll(t, fs[4])
		<-e
		if n := r.barriersAfter(time.Millisecond); n != 3 {
			t.Fatalf("%d barriers after d and e committed; want 3", n)
		}
		if got := p.notices.Load(); got != 3 {
			t.Fatalf("notice counter %d, want 3", got)
		}
	})
}

// Stopping answers what the packer holds but never proposed as retriable,
// and a write submitted afterwards is refused at once; what was proposed is
// still answered by Raft.
func TestPackerStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRaft{}
		stop := make(chan struct{})
		p := newPacker(r.apply, r.barrier, 1, time.Millisecond, 0, stop)
		ran := make(chan struct{})
		go func() { defer close(ran); p.run() }()
		ctx := context.Background()
		first := submitAsync(ctx, p, encodedRequest("a"))
		held := submitAsync(ctx, p, encodedRequest("b"))
		f1 := r.settled(t, 1)[0]
		close(stop)
		<-ran
		if s := <-held; !errors.Is(s.err, errRetry) {
			t.Fatalf("a write held when the packer stopped: %v; want errRetry", s.err)
		}
		if s := <-submitAsync(ctx, p, encodedRequest("c")); !errors.Is(s.err, errRetry) {
			t.Fatalf("a write after the stop: %v; want errRetry", s.err)
		}
		f1.done(raft.ErrRaftShutdown)
		if s := <-first; apierror.CodeOf(s.err) != apierror.Unavailable {
			t.Fatalf("the proposed write: %v", s.err)
		}
	})
}

// Concurrent writes on a real three-node cluster share log entries, and every
// caller — on the leader, or through a follower that forwards — gets its own
// command's answer, named by its own Seq (a grant's Result.Seq equals it).
// With Raft's commit timeout out of the way (an hour: the leader never sends
// an empty AppendEntries), the followers still learn of a commit no later
// entry carries, from the leader's commit notice: a follower applies the
// leader's last write, and the write it forwarded itself, well within
// CatchUp's 2 s. The writes are Ticks, which start no lease, so the leader's
// reaper stays quiet; without the notice each CatchUp would wait the hour.
func TestFollowersLearnOfTheLastCommit(t *testing.T) {
	nodes, leader := openTestClusterWith(t, []string{"n1", "n2", "n3"}, func(cfg *Config) { cfg.CommitTimeout = time.Hour })
	follower := followerKnowingLeader(t, nodes, leader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, via := range []string{leader, follower} {
		r, err := nodes[via].Apply(ctx, &command.Envelope{ClientID: "c", Body: &command.Tick{}})
		if err != nil {
			t.Fatalf("tick through %s: %v", via, err)
		}
		if err := nodes[follower].CatchUp(ctx, r.Index); err != nil {
			t.Fatalf("the follower did not apply the last write (through %s): %v", via, err)
		}
	}
	// The etcd engine needs no notices: its appends and heartbeats carry
	// the commit index (the catch-ups above are what it must pass).
	if n := nodes[leader].Status().CommitNotices; n == 0 && nodes[leader].Engine() == EngineHashicorp {
		t.Fatal("the leader counts no commit notices")
	}
}

func TestConcurrentWritesArePacked(t *testing.T) {
	nodes, leader := openTestCluster(t, []string{"n1", "n2", "n3"}, 0, nil)
	follower := followerKnowingLeader(t, nodes, leader)
	const writers = 48
	seqs := map[uint64]bool{}
	tokens := map[uint64]bool{}
	for round := 0; round < 20; round++ {
		resps := make([]*fsm.Response, writers)
		errs := make([]error, writers)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range writers {
			via := nodes[leader]
			if i%2 == 1 {
				via = nodes[follower]
			}
			wg.Go(func() {
				key, err := command.NormalizeName(fmt.Sprintf("packed/%d/%d", round, i))
				if err != nil {
					errs[i] = err
					return
				}
				<-start
				resps[i], errs[i] = via.Apply(context.Background(), &command.Envelope{ClientID: "c",
					RequestID: fmt.Sprintf("p-%d-%d", round, i), Body: &command.Acquire{Name: key, TTLms: 5000}})
			})
		}
		close(start)
		wg.Wait()
		for i, r := range resps {
			if errs[i] != nil {
				t.Fatalf("write %d: %v", i, errs[i])
			}
			// A slow machine may time an attempt out and send it again: the
			// dedup table then answers with the first grant, named by its Seq.
			if r.Result.Status != command.StatusOK || (!r.Result.Replayed && r.Result.Seq != r.Seq) {
				t.Fatalf("write %d (via %s): %+v with Seq %d; want a grant named by its own Seq",
					i, map[bool]string{true: "the follower", false: "the leader"}[i%2 == 1], r.Result, r.Seq)
			}
			if seqs[r.Result.Seq] || tokens[r.Result.Token] {
				t.Fatalf("write %d: Seq %d / token %d given twice", i, r.Result.Seq, r.Result.Token)
			}
			seqs[r.Result.Seq], tokens[r.Result.Token] = true, true
		}
		if st := nodes[leader].Status(); st.ProposedCommands > st.ProposedEntries {
			var shared bool
			for s := range seqs {
				shared = shared || s >= 1<<48 // a command after the first of its entry
			}
			if !shared {
				t.Fatal("the leader counts packed entries, but no answer came from a packed entry's later command")
			}
			return
		}
	}
	t.Fatalf("%d rounds of %d concurrent writes never shared a log entry", 20, writers)
}
