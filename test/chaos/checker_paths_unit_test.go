package chaos

import (
	"slices"
	"strings"
	"testing"
)

// These tests feed bad histories to checker paths the other unit tests do not
// reach — checkAPI, checkTokens' token-mismatch check and checkFence's
// unknown-token check — each beside a close correct history it must accept.

// kindsOf lists the anomalies' kinds, in order.
func kindsOf(as []anomaly) []string {
	var ks []string
	for _, a := range as {
		ks = append(ks, a.Kind)
	}
	return ks
}

// wantKinds fails unless as holds exactly the kinds want (in order; none when
// want is empty).
func wantKinds(t *testing.T, as []anomaly, want ...string) {
	t.Helper()
	if got := kindsOf(as); !slices.Equal(got, want) {
		var b strings.Builder
		for _, a := range as {
			b.WriteString("\n  " + a.String())
		}
		t.Fatalf("found kinds %q, want %q:%s", got, want, b.String())
	}
}

func TestAPIChecker(t *testing.T) {
	long := int64(longTTL)
	healed := 10 * s
	grant := acq("a", "L", long, 0, s/10, oOK, 1, "la")
	cases := []struct {
		name        string
		ops         []Op
		healedAt    int64
		internal500 int64
		want        []string
	}{
		// Bad histories.
		{name: "unexpected answer",
			ops: (&hb{}).add(grant).
				add(Op{Client: "b", Kind: kRelease, Lock: "L", Token: 1, Lease: "la", Call: s, Return: s + 1, Out: oError, Err: "unexpected 400 bad request"}).ops,
			healedAt: healed, want: []string{"api:unexpected-answer"}},
		{name: "unanswered after the heal",
			ops: (&hb{}).add(grant).
				add(acq("b", "L", long, healed+s, 0, oUnknown, 0, "")).ops,
			healedAt: healed, want: []string{"liveness:no-answer"}},
		{name: "500 answers",
			ops:      (&hb{}).add(grant).ops,
			healedAt: healed, internal500: 3, want: []string{"api:internal-error"}},
		// Close correct histories.
		{name: "unanswered before the heal",
			ops: (&hb{}).add(grant).
				add(acq("b", "L", long, healed-s, 0, oUnknown, 0, "")).ops,
			healedAt: healed},
		{name: "unanswered when never healed",
			ops: (&hb{}).add(grant).
				add(acq("b", "L", long, healed+s, 0, oUnknown, 0, "")).ops,
			healedAt: 0},
		{name: "definitive answers after the heal",
			ops: (&hb{}).add(grant).
				add(Op{Client: "b", Kind: kAcquire, Lock: "L", TTL: long, Call: healed + s, Return: healed + s + 1, Out: oHeld, HolderClient: "a", HolderToken: 1}).
				add(rel("b", "L", 1, "la", healed+2*s, healed+2*s+1, oNotHolder)).ops,
			healedAt: healed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantKinds(t, checkAPI(c.ops, c.healedAt, c.internal500), c.want...)
		})
	}
}

func TestTokenMismatchChecker(t *testing.T) {
	long := int64(longTTL)
	base := func() *hb {
		return (&hb{}).
			add(acq("a", "L", long, 0, s/10, oOK, 1, "la")).
			add(acq("b", "M", long, 2*s/10, 3*s/10, oOK, 2, "lb"))
	}
	cases := []struct {
		name string
		ops  []Op
		want []string
	}{
		// Bad histories: a read or conflict names a token that an
		// acknowledged grant gave to another client, or on another lock.
		{name: "read names the wrong client",
			ops:  base().add(get("L", 4*s/10, 5*s/10, true, "c", 1)).ops,
			want: []string{"safety:token-mismatch"}},
		{name: "conflict names the wrong client",
			ops:  base().add(Op{Client: "c", Kind: kAcquire, Lock: "L", TTL: long, Call: 4 * s / 10, Return: 5 * s / 10, Out: oHeld, HolderClient: "b", HolderToken: 1}).ops,
			want: []string{"safety:token-mismatch"}},
		{name: "read names a token of another lock",
			ops:  base().add(get("L", 4*s/10, 5*s/10, true, "b", 2)).ops,
			want: []string{"safety:token-mismatch"}},
		// Close correct histories.
		{name: "read and conflict name the right holder",
			ops: base().
				add(get("L", 4*s/10, 5*s/10, true, "a", 1)).
				add(Op{Client: "c", Kind: kAcquire, Lock: "M", TTL: long, Call: 6 * s / 10, Return: 7 * s / 10, Out: oHeld, HolderClient: "b", HolderToken: 2}).ops},
		// A token no acknowledged grant gave (an unanswered acquire's) is
		// not a mismatch.
		{name: "read names an unacknowledged grant",
			ops: base().
				add(acq("c", "N", long, 4*s/10, 0, oUnknown, 0, "")).
				add(get("N", 2*s, 2*s+1, true, "c", 3)).ops},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantKinds(t, checkTokens(c.ops, oneShard), c.want...)
		})
	}
}

func TestFenceUnknownTokenChecker(t *testing.T) {
	long := int64(longTTL)
	ops := (&hb{}).
		add(acq("a", "L", long, 0, s/10, oOK, 1, "la")).
		add(acq("b", "M", long, 2*s/10, 3*s/10, oOK, 2, "lb")).ops
	cases := []struct {
		name string
		w    write
		want []string
	}{
		// Bad: an accepted write with a token no acknowledged grant gave
		// that client on that lock.
		{name: "token never granted",
			w:    write{Lock: "L", Client: "a", Token: 7, At: s, Bound: 5 * s, Accepted: true},
			want: []string{"safety:fence-unknown-token"}},
		{name: "token granted to another client",
			w:    write{Lock: "L", Client: "c", Token: 1, At: s, Bound: 5 * s, Accepted: true},
			want: []string{"safety:fence-unknown-token"}},
		{name: "token granted on another lock",
			w:    write{Lock: "L", Client: "b", Token: 2, At: s, Bound: 5 * s, Accepted: true},
			want: []string{"safety:fence-unknown-token"}},
		// A rejected write with a made-up token is no safety problem (the
		// register refused it), but the harness never writes one.
		{name: "rejected write with a token never granted",
			w:    write{Lock: "L", Client: "a", Token: 7, At: s, Bound: 5 * s, MaxSeen: 9, Paused: true},
			want: []string{"harness:write-with-unknown-token"}},
		// Correct: the token its grant gave.
		{name: "token of the writer's grant",
			w: write{Lock: "L", Client: "a", Token: 1, At: s, Bound: 5 * s, Accepted: true}},
		{name: "token of the writer's grant on the other lock",
			w: write{Lock: "M", Client: "b", Token: 2, At: s, Bound: 5 * s, Accepted: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, st := checkFence(ops, []write{c.w})
			wantKinds(t, a, c.want...)
			safety := 0
			for _, k := range c.want {
				if strings.HasPrefix(k, "safety:") {
					safety++
				}
			}
			if st.writes != 1 || st.accepted+st.rejected != 1 || (st.accepted == 1) != c.w.Accepted || st.acceptedUnknownToken != safety {
				t.Fatalf("fence stats %+v", st)
			}
		})
	}
}
