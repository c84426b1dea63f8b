package raftnode

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/dlock/dlock/internal/testutil"
)

func TestCommitNoticesHeldUntilCoveredOrDue(t *testing.T) {
	notice := func(g, term, index, commit uint64) outMsg {
		return outMsg{group: g, m: raftpb.Message{Type: raftpb.MsgApp, Term: term, Index: index, Commit: commit}}
	}
	appendOf := func(g, term, index, commit uint64) outMsg {
		m := notice(g, term, index, commit)
		m.m.Entries = []raftpb.Entry{{Index: index + 1, Term: term}}
		return m
	}
	heartbeat := outMsg{group: 1, m: raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 2, Commit: 9}}
	cases := []struct {
		name string
		in   []outMsg
		// out is what the stream writes at once, in order; held what is
		// still held afterwards (released when due).
		out, held  []outMsg
		dropped    uint64
		timerArmed bool
	}{
		{name: "a notice alone waits", in: []outMsg{notice(1, 2, 10, 10)},
			held: []outMsg{notice(1, 2, 10, 10)}, timerArmed: true},
		{name: "the next append carries the commit", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 10)},
			out: []outMsg{appendOf(1, 2, 10, 10)}, dropped: 1},
		{name: "a heartbeat does not overtake it", in: []outMsg{notice(1, 2, 10, 10), heartbeat},
			out: []outMsg{notice(1, 2, 10, 10), heartbeat}},
		{name: "a newer notice replaces it", in: []outMsg{notice(1, 2, 10, 9), notice(1, 2, 10, 10)},
			held: []outMsg{notice(1, 2, 10, 10)}, dropped: 1, timerArmed: true},
		{name: "an append with a lower commit does not cover it", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 9)},
			out: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 10, 9)}},
		{name: "an append from an earlier position does not cover it", in: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 8, 10)},
			out: []outMsg{notice(1, 2, 10, 10), appendOf(1, 2, 8, 10)}},
		{name: "a new term's notice sends the old one", in: []outMsg{notice(1, 2, 10, 10), notice(1, 3, 10, 10)},
			out: []outMsg{notice(1, 2, 10, 10)}, held: []outMsg{notice(1, 3, 10, 10)}, timerArmed: true},
		{name: "groups are apart", in: []outMsg{notice(1, 2, 10, 10), appendOf(2, 2, 10, 10)},
			out: []outMsg{appendOf(2, 2, 10, 10)}, held: []outMsg{notice(1, 2, 10, 10)}, timerArmed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dropped, sent atomic.Uint64
			c := commitNotices{dropped: &dropped, sent: &sent}
			defer c.stop()
			var out []outMsg
			for _, m := range tc.in {
				out = append(out, c.next(m)...)
			}
			if got, want := fmt.Sprint(out), fmt.Sprint(tc.out); got != want {
				t.Errorf("written at once: %s, want %s", got, want)
			}
			if dropped.Load() != tc.dropped {
				t.Errorf("dropped %d notices, want %d", dropped.Load(), tc.dropped)
			}
			if (c.due() != nil) != tc.timerArmed {
				t.Errorf("timer armed %v, want %v", c.due() != nil, tc.timerArmed)
			}
			if len(tc.held) == 0 {
				return
			}
			select {
			case <-c.due():
			case <-time.After(10 * time.Second):
				t.Fatal("a held notice never fell due")
			}
			if got, want := fmt.Sprint(c.release()), fmt.Sprint(tc.held); got != want {
				t.Errorf("released %s, want %s", got, want)
			}
			if c.due() != nil {
				t.Error("the timer is still armed with nothing held")
			}
		})
	}
}

// A leader busy with writes drops most of its commit notices (each next
// append carries the commit), and once the writes stop the last notice still
// reaches the followers, which then commit everything.
func TestEtcdEngineCommitNoticesThroughARealCluster(t *testing.T) {
	nodes, _ := openEtcdCluster(t, []string{"a", "b", "c"}, nil)
	leader := nodes[waitLeader(t, nodes)]
	trans := leader.etcdTrans
	for i := range 50 {
		acquire(t, leader, fmt.Sprintf("n%d", i))
	}
	if trans.noticesDropped.Load() == 0 {
		t.Errorf("50 writes in a row dropped no commit notice (sent %d)", trans.noticesSent.Load())
	}
	want := leader.Status().CommitIndex
	testutil.Eventually(t, 10*time.Second, "a follower never learned the last commit", func() bool {
		for _, n := range nodes {
			if n.Status().CommitIndex < want {
				return false
			}
		}
		return true
	})
	sameState(t, nodes)
	t.Logf("commit notices: %d dropped, %d sent", trans.noticesDropped.Load(), trans.noticesSent.Load())
}
