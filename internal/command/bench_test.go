package command

// Micro-benchmarks of the log-entry encoding, so regressions show in review:
// `go test -run '^$' -bench . -benchmem ./internal/command`. Every write is
// encoded once on the leader and decoded once on every node.

import (
	"fmt"
	"testing"

	"github.com/dlock/dlock/internal/wire"
)

func benchLeaseID(b byte) LeaseID {
	var id LeaseID
	for i := range id {
		id[i] = b + byte(i)*7
	}
	return id
}

// benchEnvelopes are the commands of the hot paths, with realistic sizes:
// a UUID-like client id and request id and a two-segment lock name.
func benchEnvelopes() []struct {
	name string
	env  *Envelope
} {
	const client, req = "worker-0f8e2c4a-7b1d-4c3e-9a5f-6d2b8e1c0a77", "req-00000000000000000042"
	leases := make([]LeaseGen, 100)
	for i := range leases {
		leases[i] = LeaseGen{LeaseID: benchLeaseID(byte(i)), Gen: uint64(i)}
	}
	return []struct {
		name string
		env  *Envelope
	}{
		{"Acquire", &Envelope{TS: 1_700_000_000_123, ClientID: client, RequestID: req,
			Body: &Acquire{Name: "billing/batch-job", LeaseID: benchLeaseID(1), TTLms: 10_000}}},
		{"AcquireWait", &Envelope{TS: 1_700_000_000_123, ClientID: client, RequestID: req,
			Body: &Acquire{Name: "billing/batch-job", LeaseID: benchLeaseID(1), TTLms: 10_000, WaitMs: 60_000}}},
		{"Release", &Envelope{TS: 1_700_000_000_123, ClientID: client, RequestID: req,
			Body: &Release{Name: "billing/batch-job", LeaseID: benchLeaseID(1), Token: 123456789}}},
		{"Renew", &Envelope{TS: 1_700_000_000_123, ClientID: client, RequestID: req,
			Body: &Renew{Name: "billing/batch-job", LeaseID: benchLeaseID(1), Token: 123456789, TTLms: 10_000}}},
		{"KeepAlive", &Envelope{TS: 1_700_000_000_123, ClientID: client, Body: &KeepAlive{LeaseID: benchLeaseID(2)}}},
		{"ExpireLeases100", &Envelope{TS: 1_700_000_000_123, Body: &ExpireLeases{Leases: leases}}},
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range benchEnvelopes() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for range b.N {
				n = len(Encode(c.env))
			}
			b.SetBytes(int64(n))
		})
	}
}

func BenchmarkEncodeChecked(b *testing.B) {
	env := benchEnvelopes()[0].env
	b.ReportAllocs()
	for range b.N {
		if _, err := EncodeChecked(env); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, c := range benchEnvelopes() {
		b.Run(c.name, func(b *testing.B) {
			raw := Encode(c.env)
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for range b.N {
				if _, err := Decode(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStamped is the leader's per-request copy with a fresh lease id
// (crypto/rand) for an acquire with ttl_ms.
func BenchmarkStamped(b *testing.B) {
	env := &Envelope{ClientID: "w", Body: &Acquire{Name: "billing/batch-job", TTLms: 10_000}}
	b.ReportAllocs()
	for i := range b.N {
		_ = env.Stamped(int64(i))
	}
}

// BenchmarkResult is the dedup table's result encoding (snapshots) and the
// forwarding path's.
func BenchmarkResult(b *testing.B) {
	r := Result{Status: StatusOK, LeaseID: benchLeaseID(3), Token: 123456789, ExpiresAt: 1_700_000_010_123, TTLms: 10_000,
		Revision: 987654321, Seq: 55555, Holder: Holder{ClientID: "worker-7", Token: 12, GrantedAt: 1, ExpiresAt: 2}}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		w := &wire.Writer{Buf: make([]byte, 0, 128)}
		for range b.N {
			w.Buf = w.Buf[:0]
			EncodeResult(w, &r)
		}
		b.SetBytes(int64(len(w.Buf)))
	})
	b.Run("decode", func(b *testing.B) {
		w := &wire.Writer{}
		EncodeResult(w, &r)
		b.SetBytes(int64(len(w.Buf)))
		b.ReportAllocs()
		for range b.N {
			rd := wire.NewReader(w.Buf)
			if got := DecodeResult(rd); got.Token != r.Token || rd.Err() != nil {
				b.Fatal(fmt.Sprint(got, rd.Err()))
			}
		}
	})
}

// BenchmarkPacked frames n acquires into one entry (the leader, once per
// entry) and decodes it (every node); per command it should cost about what
// a lone Decode does, and the frame next to nothing.
func BenchmarkPacked(b *testing.B) {
	acq := benchEnvelopes()[0].env
	for _, n := range []int{1, 16, 64} {
		cmds := make([][]byte, n)
		for i := range cmds {
			cmds[i] = Encode(acq)
		}
		entry := EncodePacked(cmds)
		b.Run(fmt.Sprintf("Encode/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				_ = EncodePacked(cmds)
			}
			b.SetBytes(int64(len(entry)))
		})
		b.Run(fmt.Sprintf("Decode/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, _, err := DecodeEntry(entry); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(entry)))
		})
	}
}
