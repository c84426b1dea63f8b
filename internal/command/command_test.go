package command

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/dlock/dlock/internal/wire"
)

func testLease(b byte) LeaseID {
	var id LeaseID
	for i := range id {
		id[i] = b + byte(i)
	}
	return id
}

var maxLease = LeaseID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// roundTripCases are small envelopes of every type, with empty and extreme
// fields. Large (max-size) fields are covered separately so the per-offset
// truncation test stays fast.
func roundTripCases() []struct {
	name string
	env  *Envelope
} {
	long := strings.Repeat("x", 300)
	return []struct {
		name string
		env  *Envelope
	}{
		{"register/empty", &Envelope{Body: &RegisterMember{}}},
		{"tick", &Envelope{TS: 1_700_000_000_000, Clock: 86_400_000, ClockTerm: 7, ClientID: "dlock", Body: &Tick{}}},
		{"register/full", &Envelope{TS: 1_700_000_000_000, ClientID: "node", RequestID: "r1",
			Body: &RegisterMember{ID: "n1", RaftAddr: "127.0.0.1:7071", APIAddr: "127.0.0.1:7070", Version: "v1.2.3 (0123456789ab)"}}},
		{"create-session/empty", &Envelope{Body: &CreateSession{}}},
		{"create-session/full", &Envelope{TS: math.MaxInt64, ClientID: "c", RequestID: "r",
			Body: &CreateSession{LeaseID: maxLease, TTLms: MaxTTLms}}},
		{"create-session/negative", &Envelope{TS: math.MinInt64, Body: &CreateSession{LeaseID: testLease(1), TTLms: math.MinInt64}}},
		{"keepalive/empty", &Envelope{Body: &KeepAlive{}}},
		{"keepalive/full", &Envelope{TS: 42, ClientID: long, RequestID: long, Body: &KeepAlive{LeaseID: testLease(7)}}},
		{"delete-session/empty", &Envelope{Body: &DeleteSession{}}},
		{"delete-session/full", &Envelope{TS: -1, ClientID: "c", Body: &DeleteSession{LeaseID: maxLease}}},
		{"acquire/empty", &Envelope{Body: &Acquire{}}},
		{"acquire/implicit", &Envelope{TS: 1, ClientID: "c", RequestID: "r",
			Body: &Acquire{Name: "billing/batch-job", LeaseID: testLease(3), TTLms: 30_000, WaitMs: MaxWaitMs}}},
		{"acquire/session", &Envelope{TS: 2, ClientID: "c",
			Body: &Acquire{Name: strings.Repeat("n", MaxNameLen), LeaseID: maxLease, Session: true, TTLms: math.MaxInt64, WaitMs: math.MinInt64}}},
		{"acquire/campaign", &Envelope{TS: 2, ClientID: "cand",
			Body: &Acquire{Name: ElectionKey("db/primary"), LeaseID: testLease(4), TTLms: 10_000, WaitMs: 60_000, Value: strings.Repeat("v", MaxValueLen)}}},
		{"acquire/value-binary", &Envelope{Body: &Acquire{Name: "a", Value: "\x00\xff\n"}}},
		{"acquire/max-waiters", &Envelope{Body: &Acquire{Name: "a", WaitMs: 1000, MaxWaiters: 1000}}},
		{"acquire/lock-model", &Envelope{Body: &Acquire{Name: "a", WaitMs: 1000, Limit: MaxLimit, Shared: true, Subtree: true, Takeover: true}}},
		{"acquire/takeover", &Envelope{TS: 3, ClientID: "c", RequestID: "r",
			Body: &Acquire{Name: "a", LeaseID: testLease(5), TTLms: 10_000, Takeover: true}}},
		{"release/empty", &Envelope{Body: &Release{}}},
		{"release/full", &Envelope{TS: 3, ClientID: "c", RequestID: "r", Body: &Release{Name: "a", LeaseID: testLease(9), Token: math.MaxUint64}}},
		{"renew/empty", &Envelope{Body: &Renew{}}},
		{"renew/full", &Envelope{TS: 4, ClientID: "c", Body: &Renew{Name: "a/b", LeaseID: testLease(11), Token: 1 << 40, TTLms: MinTTLms}}},
		{"expire-leases/empty", &Envelope{Body: &ExpireLeases{Leases: []LeaseGen{}}}},
		{"expire-leases/many", &Envelope{TS: 5, Body: &ExpireLeases{Leases: []LeaseGen{
			{LeaseID: testLease(1), Gen: 0}, {LeaseID: testLease(2), Gen: 1}, {LeaseID: maxLease, Gen: math.MaxUint64}}}}},
		{"expire-waits/empty", &Envelope{Body: &ExpireWaits{Waits: []WaitRef{}}}},
		{"expire-waits/many", &Envelope{TS: 6, Body: &ExpireWaits{Waits: []WaitRef{
			{LeaseID: testLease(1), Name: "a", Seq: 1}, {LeaseID: testLease(2), Name: "", Seq: 0}, {LeaseID: maxLease, Name: long, Seq: math.MaxUint64}}}}},
		{"cancel-wait/empty", &Envelope{Body: &CancelWait{}}},
		{"proclaim/empty", &Envelope{Body: &Proclaim{}}},
		{"proclaim/full", &Envelope{TS: 8, ClientID: "cand", RequestID: "r",
			Body: &Proclaim{Name: ElectionKey("db/primary"), LeaseID: maxLease, Token: math.MaxUint64, Value: long}}},
		{"set-token-key/empty", &Envelope{Body: &SetTokenKey{}}},
		{"set-acl-token/empty", &Envelope{Body: &SetACLToken{}}},
		{"set-acl-token/full", &Envelope{TS: 10, ClientID: "admin", RequestID: "t",
			Body: &SetACLToken{AccessorID: [16]byte{1, 15: 2}, SecretHash: [32]byte{3, 31: 4}, Description: long,
				Rules:     []ACLRule{{Prefix: "billing/", Perms: PermLock | PermRead}, {Prefix: "", Perms: PermAll}},
				ClientIDs: []string{"worker-*", "cron"}, Bootstrap: true, TTLms: 3_600_000, CertCNs: []string{"worker-1.billing"}}}},
		{"delete-acl-token", &Envelope{Body: &DeleteACLToken{AccessorID: [16]byte{9}}}},
		{"set-token-key/full", &Envelope{TS: 9, ClientID: "dlock", RequestID: "k",
			Body: &SetTokenKey{Seed: [32]byte{1, 2, 3, 31: 0xff}, Rotate: true}}},
		{"set-token-key/revoke", &Envelope{TS: 9, ClientID: "dlock", RequestID: "k",
			Body: &SetTokenKey{Seed: [32]byte{4, 31: 0xee}, Rotate: true, RevokeRetired: true}}},
		{"cancel-wait/full", &Envelope{TS: 7, ClientID: "c", RequestID: "r",
			Body: &CancelWait{Wait: WaitRef{LeaseID: testLease(5), Name: "x/y", Seq: 99}, ReleaseIfGranted: true}}},
		{"acquire/lock-delay-value", &Envelope{TS: 3, ClientID: "c", RequestID: "r",
			Body: &Acquire{Name: "billing/batch-job", LeaseID: testLease(6), TTLms: 10_000, Value: "pid 42", LockDelayMs: MaxLockDelayMs}}},
		{"renew/value", &Envelope{TS: 4, ClientID: "c", Body: &Renew{Name: "a", LeaseID: testLease(12), Token: 9, Value: long, SetValue: true}}},
		{"revoke/empty", &Envelope{Body: &Revoke{}}},
		{"revoke/full", &Envelope{TS: 11, ClientID: "operator", RequestID: "rv", Body: &Revoke{Name: "billing/batch-job", Token: math.MaxUint64, Reason: "stuck"}}},
		{"set-history-retention", &Envelope{TS: 12, Body: &SetHistoryRetention{PerName: 16, MaxEntries: 1_000_000, MaxBytes: math.MaxInt64, MaxAgeMs: -1}}},
		{"trim-history", &Envelope{TS: 13, Clock: 86_400_001, Body: &TrimHistory{}}},
		{"end-lock-delay", &Envelope{TS: 14, Body: &EndLockDelay{Name: "a/b", Token: 77}}},
		{"split", &Envelope{TS: 15, Body: &Split{At: "m", Group: math.MaxUint64 >> 1, From: "g", To: "n"}}},
		{"split/open", &Envelope{TS: 15, Body: &Split{At: "zz", Group: 2}}},
		{"set-shard-map", &Envelope{TS: 16, Body: &SetShardMap{Generation: 3, Ranges: []ShardRange{{Start: "", ID: 0, Group: 9}, {Start: "m", ID: 4, Group: 12}}}}},
		{"set-shard-map/replicas", &Envelope{TS: 17, Body: &SetShardMap{Generation: 4, Ranges: []ShardRange{
			{Start: "", ID: 0, Group: 9, Replicas: []string{"n1", "n2", "n3"}}, {Start: "m", ID: 4, Group: 12, Replicas: []string{"n2", "n4", "n5"}, Leaving: "n2"}}}}},
		{"set-shard-map/removing", &Envelope{TS: 18, Body: &SetShardMap{Generation: 5, Ranges: []ShardRange{
			{Start: "", ID: 0, Group: 9, Replicas: []string{"n1", "n2"}}}, Removing: []string{"n4", "n3"}}}},
	}
}

// sameEnvelope compares envelopes treating nil and empty slices as equal.
func sameEnvelope(a, b *Envelope) bool {
	norm := func(e *Envelope) Envelope {
		c := *e
		c.Version = 0 // what Decode saw, not part of the command
		switch x := e.Body.(type) {
		case *ExpireLeases:
			y := *x
			if len(y.Leases) == 0 {
				y.Leases = nil
			}
			c.Body = &y
		case *ExpireWaits:
			y := *x
			if len(y.Waits) == 0 {
				y.Waits = nil
			}
			c.Body = &y
		}
		return c
	}
	na, nb := norm(a), norm(b)
	return reflect.DeepEqual(&na, &nb)
}

func TestTypeNumbersAreStable(t *testing.T) {
	// Type numbers are append-only and live in every Raft log: pin them.
	want := map[Type]Body{
		1: &RegisterMember{}, 2: &CreateSession{}, 3: &KeepAlive{}, 4: &DeleteSession{},
		5: &Acquire{}, 6: &Release{}, 7: &Renew{}, 8: &ExpireLeases{}, 9: &ExpireWaits{}, 10: &CancelWait{},
		11: &Proclaim{}, 12: &SetTokenKey{}, 13: &SetACLToken{}, 14: &DeleteACLToken{}, 15: &Tick{},
		17: &Revoke{}, 18: &SetHistoryRetention{}, 19: &TrimHistory{}, 20: &EndLockDelay{},
		21: &Split{}, 22: &SetShardMap{},
	}
	for n, b := range want {
		if b.Type() != n {
			t.Errorf("%T.Type() = %d, want %d", b, b.Type(), n)
		}
		if got := newBody(n); reflect.TypeOf(got) != reflect.TypeOf(b) {
			t.Errorf("newBody(%d) = %T, want %T", n, got, b)
		}
	}
	for n := 0; n < 256; n++ {
		if _, ok := want[Type(n)]; !ok && newBody(Type(n)) != nil {
			t.Errorf("newBody(%d) is not nil: a type number was added without updating this test", n)
		}
	}
	if Version != 11 {
		t.Errorf("Version = %d: add decode tests for the new version (see TestDecodeOlderVersions)", Version)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, tc := range roundTripCases() {
		t.Run(tc.name, func(t *testing.T) {
			b := Encode(tc.env)
			if b[0] != byte(tc.env.Body.Type()) || b[1] != Version {
				t.Fatalf("header = %d,%d; want type %d version %d", b[0], b[1], tc.env.Body.Type(), Version)
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !sameEnvelope(got, tc.env) {
				t.Fatalf("round trip mismatch:\n got %#v (%#v)\nwant %#v (%#v)", got, got.Body, tc.env, tc.env.Body)
			}
			if b2 := Encode(got); !bytes.Equal(b, b2) {
				t.Fatalf("re-encode differs:\n%x\n%x", b, b2)
			}
		})
	}
}

func TestEncodeDecodeMaxSizeFields(t *testing.T) {
	big := strings.Repeat("z", wire.MaxString) // the largest string the decoder accepts
	many := make([]LeaseGen, 5000)
	waits := make([]WaitRef, 2000)
	for i := range many {
		many[i] = LeaseGen{LeaseID: testLease(byte(i)), Gen: uint64(i) << 40}
	}
	for i := range waits {
		waits[i] = WaitRef{LeaseID: testLease(byte(i)), Name: strings.Repeat("w", i%300), Seq: uint64(i)}
	}
	cases := []struct {
		name string
		env  *Envelope
	}{
		{"register", &Envelope{ClientID: big, RequestID: big, Body: &RegisterMember{ID: big, RaftAddr: big, APIAddr: big}}},
		{"acquire", &Envelope{ClientID: big, Body: &Acquire{Name: big, LeaseID: maxLease, Session: true, TTLms: math.MaxInt64, WaitMs: math.MaxInt64}}},
		{"release", &Envelope{Body: &Release{Name: big, Token: math.MaxUint64}}},
		{"renew", &Envelope{Body: &Renew{Name: big, Token: math.MaxUint64, TTLms: math.MinInt64}}},
		{"expire-leases", &Envelope{Body: &ExpireLeases{Leases: many}}},
		{"expire-waits", &Envelope{Body: &ExpireWaits{Waits: waits}}},
		{"cancel-wait", &Envelope{Body: &CancelWait{Wait: WaitRef{Name: big, Seq: math.MaxUint64}, ReleaseIfGranted: true}}},
		{"acquire-value", &Envelope{Body: &Acquire{Name: "a", Value: big}}},
		{"proclaim", &Envelope{Body: &Proclaim{Name: big, Value: big, Token: math.MaxUint64}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := Encode(tc.env)
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !sameEnvelope(got, tc.env) {
				t.Fatal("round trip mismatch")
			}
			if !bytes.Equal(Encode(got), b) {
				t.Fatal("re-encode differs")
			}
			// Truncation at a sample of offsets (every offset would be slow here).
			for _, n := range []int{0, 1, 2, 3, len(b) / 3, len(b) / 2, len(b) - 17, len(b) - 2, len(b) - 1} {
				if n < 0 || n >= len(b) {
					continue
				}
				if _, err := Decode(b[:n]); err == nil {
					t.Errorf("Decode of %d/%d bytes succeeded", n, len(b))
				}
			}
		})
	}
	// One byte more than wire.MaxString is refused even though the input
	// holds all of it.
	over := Encode(&Envelope{ClientID: big + "z", Body: &KeepAlive{}})
	if _, err := Decode(over); err == nil {
		t.Errorf("Decode accepted a %d-byte client_id (over wire.MaxString)", len(big)+1)
	}
}

// A newer node reads an older log: version 1 entries (before Acquire.Value)
// and version 2 entries (before SetTokenKey.RevokeRetired) decode to the same
// command with those fields empty, and re-encode at the current version.
// Acquires before version 5 decode with Takeover true (they always took
// over); before version 6 they are exclusive, limit 1, one name.
func TestDecodeOlderVersions(t *testing.T) {
	for _, old := range []byte{1, 2, 3, 4, 5, 6} {
		for _, tc := range roundTripCases() {
			e := *tc.env
			if e.Body.Type() >= TypeRevoke {
				continue // added with version 7
			}
			switch b := e.Body.(type) {
			case *Renew:
				c := *b
				c.Value, c.SetValue = "", false // added with version 7
				e.Body = &c
			case *Acquire:
				c := *b
				c.LockDelayMs = 0                              // added with version 7
				c.Limit, c.Shared, c.Subtree = 0, false, false // added with version 6
				if old < 5 {
					c.MaxWaiters = 0 // added with version 5
					c.Takeover = true
				}
				if old < 2 {
					c.Value = ""
				}
				e.Body = &c
			case *RegisterMember:
				if old < 5 {
					c := *b
					c.Version = "" // added with version 5
					e.Body = &c
				}
			case *Proclaim:
				if old < 2 {
					continue // added with version 2
				}
			case *SetTokenKey:
				if old < 3 {
					c := *b
					c.RevokeRetired = false
					e.Body = &c
				}
			}
			if old < 3 {
				e.Clock = 0 // added with version 3
			}
			if old < 4 {
				e.ClockTerm = 0 // added with version 4
			}
			cur := Encode(&e)
			b := oldEnvelope(t, cur, old)
			b[1] = old
			// Cut the fields of version 7 (zero here): Acquire.LockDelayMs,
			// Renew.Value and SetValue, all last.
			v7 := 0
			switch e.Body.(type) {
			case *Acquire:
				v7 = 1
			case *Renew:
				v7 = 2
			}
			for ; v7 > 0; v7-- {
				if b[len(b)-1] != 0 {
					t.Fatalf("%s: a version 7 field is not last or not zero", tc.name)
				}
				b = b[:len(b)-1]
			}
			// Cut the fields the old version did not have; each was the
			// last field of its command, and empty here (Takeover, last
			// of all, is true).
			_, isAcquire := e.Body.(*Acquire)
			if isAcquire && old < 6 {
				// Limit, Shared and Subtree (version 6), all zero.
				if !bytes.Equal(b[len(b)-3:], []byte{0, 0, 0}) {
					t.Fatalf("%s: the version 6 fields are not the last ones", tc.name)
				}
				b = b[:len(b)-3]
			}
			if isAcquire && old < 5 {
				if b[len(b)-1] != 1 {
					t.Fatalf("%s: Acquire.Takeover is not the last field", tc.name)
				}
				b = b[:len(b)-1]
			}
			_, isSetKey := e.Body.(*SetTokenKey)
			isSetKey = isSetKey && old < 3
			_, isRegister := e.Body.(*RegisterMember)
			isRegister = isRegister && old < 5
			cut := 0
			switch {
			case isAcquire && old < 2:
				cut = 2 // Value and MaxWaiters
			case isAcquire && old < 5, isSetKey, isRegister && old < 5:
				cut = 1
			}
			if isRegister && old >= 5 {
				cut = 0
			}
			for ; cut > 0; cut-- {
				if b[len(b)-1] != 0 {
					t.Fatalf("%s: the field added after version %d is not the last one", tc.name, old)
				}
				b = b[:len(b)-1]
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatalf("%s: version %d entry refused: %v", tc.name, old, err)
			}
			if !sameEnvelope(got, &e) {
				t.Fatalf("%s: version %d decodes to %#v, want %#v", tc.name, old, got.Body, e.Body)
			}
			if !bytes.Equal(Encode(got), cur) {
				t.Fatalf("%s: version %d entry does not re-encode at version %d", tc.name, old, Version)
			}
			if isAcquire || isSetKey || isRegister {
				// A current entry labelled with the old version has a
				// trailing field the old version did not have.
				bad := oldEnvelope(t, cur, old)
				bad = append(bad, 0)
				bad[1] = old
				if _, err := Decode(bad); err == nil {
					t.Errorf("%s: version %d entry with the newer field accepted", tc.name, old)
				}
			}
		}
	}
}

// Exact bytes of SetTokenKey entries as the build before RevokeRetired
// (command Version 2) wrote them, printed by Encode of that checkout: a
// rotation and a bootstrap. They must decode exactly as before, without a
// revocation, since the log they sit in is replayed by every newer node.
func TestDecodeVersion2SetTokenKey(t *testing.T) {
	for _, tc := range []struct {
		hex  string
		want SetTokenKey
	}{
		{"0c0280a0abfef96205646c6f636b0001020300000000000000000000000000000000000000000000000000000000ff01",
			SetTokenKey{Seed: [32]byte{1, 2, 3, 31: 0xff}, Rotate: true}},
		{"0c0280a0abfef96205646c6f636b00070000000000000000000000000000000000000000000000000000000000000000",
			SetTokenKey{Seed: [32]byte{7}}},
	} {
		b, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		e, err := Decode(b)
		if err != nil {
			t.Fatalf("version 2 SetTokenKey refused: %v", err)
		}
		got, ok := e.Body.(*SetTokenKey)
		if !ok || *got != tc.want || e.TS != 1_700_000_000_000 || e.ClientID != "dlock" || e.RequestID != "" {
			t.Fatalf("decoded %+v %#v, want %+v", e, e.Body, tc.want)
		}
		// Re-encoded, it is the same command at the current version, with
		// RevokeRetired written out as false.
		re := oldEnvelope(t, Encode(e), 2)
		if re[1] != Version || !bytes.Equal(re[2:len(re)-1], b[2:]) || re[len(re)-1] != 0 {
			t.Fatalf("re-encoded as %x", re)
		}
	}
}

// Every envelope a leader may propose must be decodable: an entry the leader
// can propose but no replica can apply makes every FSM panic at that index.
// Proposals go through EncodeChecked, which refuses what Decode would.
func TestEncodeCheckedOutputIsAlwaysDecodable(t *testing.T) {
	for _, size := range []int{MaxEntryBytes - 100, MaxEntryBytes, wire.MaxString + 1} {
		big := strings.Repeat("z", size)
		for _, e := range []*Envelope{
			{ClientID: big, Body: &KeepAlive{}},
			{RequestID: big, Body: &KeepAlive{}},
			{Body: &Acquire{Name: big}},
			{Body: &RegisterMember{APIAddr: big}},
		} {
			b, err := EncodeChecked(e)
			if err != nil {
				if !errors.Is(err, ErrTooLarge) {
					t.Errorf("%T: unexpected error %v", e.Body, err)
				}
				continue
			}
			if _, err := Decode(b); err != nil {
				t.Errorf("%T (%d bytes): EncodeChecked produced an entry Decode refuses: %v", e.Body, size, err)
			}
		}
	}
}

func TestDecodeRejectsUnknownType(t *testing.T) {
	for _, typ := range []int{0, 16, 23, 100, 254, 255} {
		for _, body := range [][]byte{nil, {0, 0, 0}, Encode(&Envelope{Body: &KeepAlive{}})[2:]} {
			b := append([]byte{byte(typ), Version}, body...)
			e, err := Decode(b)
			if err == nil || e != nil {
				t.Fatalf("type %d: Decode = %v, %v; want error", typ, e, err)
			}
			if !errors.Is(err, ErrUnknownType) {
				t.Errorf("type %d: error %v does not wrap ErrUnknownType", typ, err)
			}
		}
	}
}

func TestDecodeRejectsVersions(t *testing.T) {
	for _, tc := range roundTripCases() {
		b := Encode(tc.env)
		for _, v := range []byte{0, Version + 1, Version + 2, 255} {
			c := append([]byte(nil), b...)
			c[1] = v
			e, err := Decode(c)
			if err == nil || e != nil {
				t.Errorf("%s version %d: Decode succeeded", tc.name, v)
				continue
			}
			if errors.Is(err, ErrUnknownType) {
				t.Errorf("%s version %d: reported as unknown type: %v", tc.name, v, err)
			}
		}
	}
}

func TestDecodeRejectsTruncationAtEveryOffset(t *testing.T) {
	for _, tc := range roundTripCases() {
		b := Encode(tc.env)
		for n := 0; n < len(b); n++ {
			e, err := Decode(b[:n:n])
			if err == nil || e != nil {
				t.Errorf("%s: Decode of first %d of %d bytes succeeded: %#v", tc.name, n, len(b), e)
			}
		}
	}
	if _, err := Decode(nil); err == nil {
		t.Error("Decode(nil) succeeded")
	}
}

func TestDecodeRejectsTrailingBytes(t *testing.T) {
	for _, tc := range roundTripCases() {
		b := Encode(tc.env)
		for _, extra := range [][]byte{{0}, {1}, {0xff}, []byte("trailing"), Encode(tc.env)} {
			c := append(append([]byte(nil), b...), extra...)
			if e, err := Decode(c); err == nil || e != nil {
				t.Errorf("%s + %x: Decode succeeded", tc.name, extra)
			}
		}
	}
}

func TestDecodeRejectsMalformedFields(t *testing.T) {
	hdr := func(t Type) *wire.Writer {
		w := &wire.Writer{}
		w.Byte(byte(t))
		w.Byte(Version)
		w.Varint(0)  // TS
		w.Varint(0)  // Clock
		w.Uvarint(0) // ClockTerm
		w.String("")
		w.String("")
		return w
	}
	cases := map[string][]byte{}
	// Bool bytes other than 0/1. Each entry is complete but for that byte: the
	// same bytes with a 1 there must decode, or the case would pass for
	// another reason (a truncated entry is refused anyway).
	boolCases := map[string]func(b byte) []byte{
		"acquire/bad-bool": func(b byte) []byte {
			w := hdr(TypeAcquire)
			w.String("a")
			w.Fixed(make([]byte, 16))
			w.Byte(b)
			w.Varint(1000)
			w.Varint(0)
			w.String("") // Value (version 2)
			w.Varint(0)  // MaxWaiters (version 5)
			w.Byte(0)    // Takeover (version 5)
			w.Varint(0)  // Limit (version 6)
			w.Byte(0)    // Shared (version 6)
			w.Byte(0)    // Subtree (version 6)
			w.Varint(0)  // LockDelayMs (version 7)
			return w.Buf
		},
		"acquire/bad-shared": func(b byte) []byte {
			w := hdr(TypeAcquire)
			w.String("a")
			w.Fixed(make([]byte, 16))
			w.Byte(0)
			w.Varint(1000)
			w.Varint(0)
			w.String("")
			w.Varint(0)
			w.Byte(0)
			w.Varint(3)
			w.Byte(b)
			w.Byte(0)
			w.Varint(0) // LockDelayMs
			return w.Buf
		},
		"acquire/bad-takeover": func(b byte) []byte {
			w := hdr(TypeAcquire)
			w.String("a")
			w.Fixed(make([]byte, 16))
			w.Byte(0)
			w.Varint(1000)
			w.Varint(0)
			w.String("")
			w.Varint(0)
			w.Byte(b)
			w.Varint(0)
			w.Byte(0)
			w.Byte(0)
			w.Varint(0) // LockDelayMs
			return w.Buf
		},
		"cancel-wait/bad-bool": func(b byte) []byte {
			w := hdr(TypeCancelWait)
			w.Fixed(make([]byte, 16))
			w.String("a")
			w.Uvarint(1)
			w.Byte(b)
			return w.Buf
		},
	}
	for name, build := range boolCases {
		if _, err := Decode(build(1)); err != nil {
			t.Fatalf("%s: the well-formed control entry does not decode: %v", name, err)
		}
		cases[name] = build(2)
		cases[name+"-7"] = build(7)
	}
	{ // Hostile element count: must neither allocate it nor succeed.
		w := hdr(TypeExpireLeases)
		w.Uvarint(1 << 62)
		cases["expire-leases/huge-count"] = w.Buf
		w = hdr(TypeExpireWaits)
		w.Uvarint(math.MaxUint64)
		cases["expire-waits/huge-count"] = w.Buf
		w = hdr(TypeExpireLeases)
		w.Uvarint(2)
		w.Fixed(make([]byte, 17))
		cases["expire-leases/count-exceeds-elements"] = w.Buf
	}
	{ // String length beyond the input.
		w := &wire.Writer{}
		w.Byte(byte(TypeKeepAlive))
		w.Byte(Version)
		w.Varint(0)
		w.Varint(0)
		w.Uvarint(0)
		w.Uvarint(1 << 40)
		cases["client-id/huge-length"] = w.Buf
	}
	{ // Varint longer than 64 bits.
		b := []byte{byte(TypeKeepAlive), Version}
		b = append(b, bytes.Repeat([]byte{0xff}, 11)...)
		cases["ts/overflow"] = b
	}
	for name, b := range cases {
		if e, err := Decode(b); err == nil || e != nil {
			t.Errorf("%s: Decode succeeded: %#v", name, e)
		}
	}
}

// Non-minimal varints make two different byte strings decode to the same
// command, so "decode then encode" is not the identity on accepted input.
func TestDecodeRejectsOverlongVarint(t *testing.T) {
	// A keep-alive with its time field as 0x80 0x00 (0 in two bytes) instead of
	// 0x00; the minimal form must decode, the overlong one must not.
	ok := []byte{byte(TypeKeepAlive), Version, 0x00, 0, 0, 0, 0}
	ok = append(ok, make([]byte, 16)...)
	if _, err := Decode(ok); err != nil {
		t.Fatalf("control: minimal entry refused: %v", err)
	}
	b := []byte{byte(TypeKeepAlive), Version, 0x80, 0x00, 0, 0, 0, 0}
	b = append(b, make([]byte, 16)...)
	if e, err := Decode(b); err == nil {
		t.Errorf("Decode accepted an overlong varint: %#v; re-encodes to %x, input %x", e, Encode(e), b)
	}
}

func FuzzDecode(f *testing.F) {
	for _, tc := range roundTripCases() {
		f.Add(Encode(tc.env))
	}
	f.Add([]byte{})
	f.Add([]byte{byte(TypeAcquire), 0})
	f.Add([]byte{byte(TypeExpireWaits), Version, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	v1 := Encode(&Envelope{Body: &Acquire{Name: "a", TTLms: 1000}})
	v1[1] = 1
	f.Add(v1[:len(v1)-1])
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Decode(b)
		if err != nil {
			if e != nil {
				t.Fatalf("Decode returned both an envelope and error %v", err)
			}
			return
		}
		if b[1] == 0 || b[1] > Version {
			t.Fatalf("accepted version %d", b[1])
		}
		re := Encode(e)
		// Older versions re-encode at the current one, so only current-version
		// entries must come back byte for byte.
		if b[1] == Version && !bytes.Equal(re, b) {
			t.Fatalf("decode/encode is not the identity:\n in %x\nout %x", b, re)
		}
		// Whatever decodes must re-decode to the same command and be a fixpoint.
		e2, err := Decode(re)
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if !sameEnvelope(e, e2) {
			t.Fatalf("re-decode differs: %#v vs %#v", e.Body, e2.Body)
		}
		if !bytes.Equal(Encode(e2), re) {
			t.Fatal("encoding is not a fixpoint")
		}
	})
}

func TestStamped(t *testing.T) {
	preset := testLease(0x40)
	leaseOf := func(b Body) LeaseID {
		switch x := b.(type) {
		case *CreateSession:
			return x.LeaseID
		case *Acquire:
			return x.LeaseID
		case *KeepAlive:
			return x.LeaseID
		case *Release:
			return x.LeaseID
		case *Renew:
			return x.LeaseID
		case *CancelWait:
			return x.Wait.LeaseID
		case *Proclaim:
			return x.LeaseID
		}
		return LeaseID{}
	}
	cases := []struct {
		name  string
		body  Body
		draws bool // a new lease id must be drawn; otherwise it stays as it was
	}{
		{"create-session/zero", &CreateSession{TTLms: 1000}, true},
		{"create-session/preset", &CreateSession{LeaseID: preset}, false},
		{"acquire/implicit-zero", &Acquire{Name: "a", TTLms: 1000}, true},
		{"acquire/implicit-preset", &Acquire{Name: "a", LeaseID: preset}, false},
		{"acquire/session", &Acquire{Name: "a", Session: true, LeaseID: preset}, false},
		{"acquire/session-zero", &Acquire{Name: "a", Session: true}, false},
		{"keepalive", &KeepAlive{LeaseID: preset}, false},
		{"release", &Release{}, false},
		{"renew", &Renew{LeaseID: preset}, false},
		{"cancel", &CancelWait{}, false},
		{"proclaim", &Proclaim{Name: "@e/x", LeaseID: preset}, false},
		{"register", &RegisterMember{ID: "n1"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &Envelope{ClientID: "c", RequestID: "r", Body: tc.body}
			before := leaseOf(tc.body)
			origBytes := Encode(e)
			s1 := e.Stamped(1234)
			s2 := e.Stamped(1234)
			if s1.TS != 1234 || s1.ClientID != "c" || s1.RequestID != "r" || s1.Body.Type() != tc.body.Type() {
				t.Fatalf("stamped envelope = %#v", s1)
			}
			// The original stays unstamped, so a retry proposes afresh.
			if e.TS != 0 || !bytes.Equal(Encode(e), origBytes) || leaseOf(tc.body) != before {
				t.Fatal("Stamped modified the original envelope")
			}
			got := leaseOf(s1.Body)
			if tc.draws {
				if got.IsZero() {
					t.Fatal("no lease id drawn")
				}
				if got == leaseOf(s2.Body) {
					t.Fatal("two stampings drew the same lease id")
				}
			} else if got != before {
				t.Fatalf("lease id changed from %v to %v", before, got)
			}
			if _, err := Decode(Encode(s1)); err != nil {
				t.Fatalf("stamped envelope does not round trip: %v", err)
			}
		})
	}
}

func TestIdempotent(t *testing.T) {
	// Replaying these would draw new leases or tokens: never retry blindly.
	for _, typ := range []Type{TypeCreateSession, TypeAcquire, TypeRelease, TypeDeleteSession} {
		if (&Envelope{Body: newBody(typ)}).Idempotent() {
			t.Errorf("type %d claims to be idempotent", typ)
		}
	}
	// These only act on an exact (lease, generation) or (lease, name, seq).
	for _, typ := range []Type{TypeRegisterMember, TypeExpireLeases, TypeExpireWaits, TypeCancelWait} {
		if !(&Envelope{Body: newBody(typ)}).Idempotent() {
			t.Errorf("type %d is not idempotent", typ)
		}
	}
}

func TestNewLeaseIDIsRandom(t *testing.T) {
	seen := map[LeaseID]bool{}
	for range 1000 {
		id := NewLeaseID()
		if id.IsZero() || seen[id] {
			t.Fatalf("NewLeaseID returned zero or repeated id %v", id)
		}
		seen[id] = true
	}
}

func TestParseLeaseID(t *testing.T) {
	id := LeaseID{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}
	const s = "0123456789abcdeffedcba9876543210"
	if id.String() != s {
		t.Fatalf("String = %q", id.String())
	}
	cases := []struct {
		in   string
		want LeaseID
		ok   bool
	}{
		{s, id, true},
		{strings.ToUpper(s), id, true},
		{"00000000000000000000000000000000", LeaseID{}, true},
		{"ffffffffffffffffffffffffffffffff", maxLease, true},
		{"", LeaseID{}, false},
		{s[:31], LeaseID{}, false},
		{s + "0", LeaseID{}, false},
		{"0x" + s[:30], LeaseID{}, false},
		{"g123456789abcdeffedcba9876543210", LeaseID{}, false},
		{" 123456789abcdeffedcba9876543210", LeaseID{}, false},
		{"0123456789abcdeffedcba987654321\x00", LeaseID{}, false},
		{"0123456789abcdef-edcba9876543210", LeaseID{}, false},
		{"é123456789abcdeffedcba987654321", LeaseID{}, false}, // 32 bytes, not hex
	}
	for _, tc := range cases {
		got, err := ParseLeaseID(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseLeaseID(%q) err = %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if tc.ok && got != tc.want {
			t.Errorf("ParseLeaseID(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for range 100 {
		r := NewLeaseID()
		got, err := ParseLeaseID(r.String())
		if err != nil || got != r {
			t.Fatalf("round trip of %v: %v, %v", r, got, err)
		}
	}
}

func TestStatusString(t *testing.T) {
	want := map[Status]string{
		StatusOK: "ok", StatusQueued: "queued", StatusLockHeld: "lock_held", StatusNotHolder: "not_holder",
		StatusSessionNotFound: "session_not_found", StatusInvalid: "invalid", StatusNotWaiting: "not_waiting",
	}
	for s, w := range want {
		if s.String() != w {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), w)
		}
	}
	// Pinned: statuses live in the replicated dedup table.
	if StatusOK != 1 || StatusNotWaiting != 7 {
		t.Error("status numbers changed")
	}
	if Status(0).String() != "status(0)" || Status(200).String() != "status(200)" {
		t.Error("unknown status string")
	}
}

func TestResultRoundTrip(t *testing.T) {
	cases := []Result{
		{},
		{Status: StatusOK, LeaseID: maxLease, Token: math.MaxUint64, ExpiresAt: math.MaxInt64, TTLms: math.MinInt64,
			Revision: 1 << 50, Seq: 7, Holder: Holder{ClientID: "c", Token: 3, GrantedAt: -5, ExpiresAt: 9}, Message: "hello"},
		{Status: StatusInvalid, Message: strings.Repeat("m", 1000)},
	}
	for i, r := range cases {
		w := &wire.Writer{}
		EncodeResult(w, &r)
		rd := wire.NewReader(w.Buf)
		got := DecodeResult(rd)
		if rd.Err() != nil || rd.Len() != 0 || got != r {
			t.Errorf("case %d: got %#v err %v left %d", i, got, rd.Err(), rd.Len())
		}
		for n := 0; n < len(w.Buf); n++ {
			rd := wire.NewReader(w.Buf[:n])
			DecodeResult(rd)
			if rd.Err() == nil {
				t.Errorf("case %d: truncated result of %d bytes decoded", i, n)
			}
		}
	}
}

// oldEnvelope gives an encoded current entry the envelope layout of version
// v: without ClockTerm (version 4, right after Clock) below 4, and without
// Clock (version 3, right after TS) below 3; the fields dropped must be 0.
func oldEnvelope(t *testing.T, b []byte, v byte) []byte {
	t.Helper()
	if v >= 4 {
		return append([]byte(nil), b...)
	}
	r := wire.NewReader(b[2:])
	r.Varint() // TS
	clockAt := len(b) - r.Len()
	clock := r.Varint()
	termAt := len(b) - r.Len()
	if term := r.Uvarint(); r.Err() != nil || (v < 4 && (term != 0 || b[termAt] != 0)) {
		t.Fatalf("oldEnvelope: entry %x has a clock term", b)
	}
	out := append([]byte(nil), b...)
	if v < 4 {
		out = append(out[:termAt], out[termAt+1:]...)
	}
	if v < 3 {
		if clock != 0 || out[clockAt] != 0 {
			t.Fatalf("oldEnvelope: entry %x has a clock", b)
		}
		out = append(out[:clockAt], out[clockAt+1:]...)
	}
	return out
}

// Exact bytes of SetACLToken entries under command version 2, which has two
// layouts: the first builds with ACLs (350f8fa, printed by its Encode) ended
// after Bootstrap; later version 2 builds appended TTLms and CertCNs without
// raising the version. Both must decode, as every newer node replays them.
func TestDecodeVersion2SetACLTokenBothLayouts(t *testing.T) {
	const first = "0d0280a0abfef9620561646d696e057265712d310100000000000000000000000000000002000000000000000000000000000000000000000000000000000000000000000f626f6f74737472617020746f6b656e01001f0001"
	b, err := hex.DecodeString(first)
	if err != nil {
		t.Fatal(err)
	}
	e, err := Decode(b)
	if err != nil {
		t.Fatalf("a version 2 ACL entry of the first layout is refused: %v", err)
	}
	got, ok := e.Body.(*SetACLToken)
	if !ok || !got.Bootstrap || got.TTLms != 0 || len(got.CertCNs) != 0 || got.Description != "bootstrap token" ||
		len(got.Rules) != 1 || got.Rules[0].Perms != PermRead|PermLock|PermElect|PermWatch|PermAdmin || e.ClientID != "admin" || e.RequestID != "req-1" {
		t.Fatalf("decoded %+v %+v", e, got)
	}
	// The later version 2 layout: the same entry with TTLms and CertCNs.
	later := append(append([]byte(nil), b...), 0x90, 0x1c, 1, 2, 'c', 'n')
	e, err = Decode(later)
	if err != nil {
		t.Fatalf("a version 2 ACL entry of the later layout is refused: %v", err)
	}
	if got := e.Body.(*SetACLToken); got.TTLms != 1800 || len(got.CertCNs) != 1 || got.CertCNs[0] != "cn" {
		t.Fatalf("later layout decoded %+v", got)
	}
	// Version 3 has only the later layout: the first one is cut short.
	b[1] = 3
	if _, err := Decode(withZeroClock(b)); err == nil {
		t.Error("a version 3 ACL entry without TTLms and CertCNs accepted")
	}
}

// withZeroClock gives a version 2 layout entry the zero lease clock version 3
// has after TS.
func withZeroClock(b []byte) []byte {
	r := wire.NewReader(b[2:])
	r.Varint()
	at := len(b) - r.Len()
	return append(append(append([]byte(nil), b[:at]...), 0), b[at:]...)
}

func TestDecodeVersion7(t *testing.T) {
	// Version 8 changed no encoding: a version 7 entry is the same bytes
	// but for its version byte, and decodes to the same command, with a
	// session's lost grants not remembered.
	for _, tc := range roundTripCases() {
		if tc.env.Body.Type() >= TypeSplit {
			continue // version 9 (TestVersion9)
		}
		b := Encode(tc.env)
		b[1] = 7
		e, err := Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if e.Version != 7 || e.RemembersLostGrants() || !e.ValueOnLocks() {
			t.Fatalf("%s: version %d, remembers lost grants %v, values on locks %v", tc.name, e.Version, e.RemembersLostGrants(), e.ValueOnLocks())
		}
		e.Version = 0
		if !reflect.DeepEqual(e, tc.env) {
			t.Fatalf("%s: decoded %+v, want %+v", tc.name, e, tc.env)
		}
	}
	if !(&Envelope{}).RemembersLostGrants() || !(&Envelope{Version: 8}).RemembersLostGrants() {
		t.Fatal("a current entry must remember lost grants")
	}
}

// TestVersion9 keeps the entries of versions 7 and 8 (same layouts as 9 for
// every type they had) decoding, and refuses the version 9 types labelled
// with an older version.
func TestVersion9(t *testing.T) {
	for _, tc := range roundTripCases() {
		cur := Encode(tc.env)
		for _, old := range []byte{7, 8} {
			b := append([]byte(nil), cur...)
			b[1] = old
			got, err := Decode(b)
			if tc.env.Body.Type() >= TypeSplit {
				if err == nil {
					t.Errorf("%s: accepted with version %d", tc.name, old)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: version %d refused: %v", tc.name, old, err)
			}
			if !sameEnvelope(got, tc.env) {
				t.Fatalf("%s: version %d decodes to %#v", tc.name, old, got.Body)
			}
		}
	}
}

// TestVersion10 reads a version 9 shard map, written before ranges had
// replica sets, byte for byte as that version wrote it: every range then
// runs on every node (no Replicas). A version 10 map round-trips its sets.
func TestVersion10(t *testing.T) {
	w := &wire.Writer{}
	w.Byte(byte(TypeSetShardMap))
	w.Byte(9)
	w.Varint(16) // TS
	w.Varint(0)  // Clock
	w.Uvarint(0) // ClockTerm
	w.String("")
	w.String("")
	w.Uvarint(3) // generation
	w.Uvarint(2)
	w.String("")
	w.Uvarint(0)
	w.Uvarint(9)
	w.String("m")
	w.Uvarint(4)
	w.Uvarint(12)
	e, err := Decode(w.Buf)
	if err != nil {
		t.Fatal(err)
	}
	want := &SetShardMap{Generation: 3, Ranges: []ShardRange{{Start: "", ID: 0, Group: 9}, {Start: "m", ID: 4, Group: 12}}}
	if e.Version != 9 || !reflect.DeepEqual(e.Body, want) {
		t.Fatalf("version %d body %#v; want version 9 %#v", e.Version, e.Body, want)
	}
	// The same bytes labelled version 10 lack the replica counts.
	b := append([]byte(nil), w.Buf...)
	b[1] = 10
	if _, err := Decode(b); err == nil {
		t.Fatal("a version 9 body labelled version 10 decoded")
	}
}

// TestVersion11 reads a version 10 shard map byte for byte as that version
// wrote it (no Removing), and refuses those bytes labelled version 11,
// which must carry the removing count.
func TestVersion11(t *testing.T) {
	w := &wire.Writer{}
	w.Byte(byte(TypeSetShardMap))
	w.Byte(10)
	w.Varint(16) // TS
	w.Varint(0)  // Clock
	w.Uvarint(0) // ClockTerm
	w.String("")
	w.String("")
	w.Uvarint(3) // generation
	w.Uvarint(1)
	w.String("")
	w.Uvarint(0)
	w.Uvarint(9)
	w.Uvarint(2) // replicas
	w.String("n1")
	w.String("n2")
	w.String("n2") // leaving
	e, err := Decode(w.Buf)
	if err != nil {
		t.Fatal(err)
	}
	want := &SetShardMap{Generation: 3, Ranges: []ShardRange{{Start: "", ID: 0, Group: 9, Replicas: []string{"n1", "n2"}, Leaving: "n2"}}}
	if e.Version != 10 || !reflect.DeepEqual(e.Body, want) {
		t.Fatalf("version %d body %#v; want version 10 %#v", e.Version, e.Body, want)
	}
	b := append([]byte(nil), w.Buf...)
	b[1] = 11
	if _, err := Decode(b); err == nil {
		t.Fatal("a version 10 body labelled version 11 decoded")
	}
	// Version 11 round-trips Removing.
	w.Buf[1] = 11
	w.Uvarint(1)
	w.String("n7")
	e, err = Decode(w.Buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Body.(*SetShardMap).Removing; !reflect.DeepEqual(got, []string{"n7"}) {
		t.Fatalf("removing %v, want [n7]", got)
	}
}
