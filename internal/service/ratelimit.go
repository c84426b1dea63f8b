package service

import (
	"math"
	"sync"
	"time"
)

// rateLimiter is a set of token buckets, one per key (a client_id, or a
// remote address for requests without one). It is written here rather than
// taken from golang.org/x/time/rate because the module does not depend on it
// and a keyed bucket is a few lines.
//
// Memory is bounded: a bucket that has refilled completely is the same as a
// new one, so it can be forgotten without changing any answer; sweeps drop
// such buckets. If maxKeys buckets are still busy (a flood of made-up
// client_ids), new keys share one overflow bucket rather than growing the map.
type rateLimiter struct {
	rate    float64 // tokens per second
	burst   float64
	maxKeys int
	now     func() time.Time

	mu        sync.Mutex
	buckets   map[string]*bucket
	overflow  bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

// rateMaxKeys bounds the buckets kept: about 100 bytes each.
const rateMaxKeys = 100_000

// sweepEvery spaces sweeps, so a full map of busy buckets does not make
// every request walk it.
const sweepEvery = time.Second

func newRateLimiter(rate float64, burst int, now func() time.Time) *rateLimiter {
	if now == nil {
		now = time.Now
	}
	return &rateLimiter{rate: rate, burst: float64(burst), maxKeys: rateMaxKeys, now: now,
		buckets: map[string]*bucket{}, overflow: bucket{tokens: float64(burst)}}
}

// allow takes one token from key's bucket. When there is none it says how
// long until there will be.
func (l *rateLimiter) allow(key string) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.lastSweep) >= time.Minute {
		// Occasional sweeps keep an idle map small without a goroutine.
		l.sweep(now)
	}
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.maxKeys {
			l.sweep(now)
		}
		if len(l.buckets) < l.maxKeys {
			b = &bucket{tokens: l.burst, last: now}
			l.buckets[key] = b
		} else {
			b = &l.overflow
		}
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration(math.Ceil((1 - b.tokens) / l.rate * float64(time.Second)))
	return false, wait
}

func (l *rateLimiter) refill(b *bucket, now time.Time) {
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(l.burst, b.tokens+el.Seconds()*l.rate)
	}
	b.last = now
}

// sweep forgets the buckets that are full again; at most once per
// sweepEvery.
func (l *rateLimiter) sweep(now time.Time) {
	if now.Sub(l.lastSweep) < sweepEvery {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst {
			delete(l.buckets, k)
		}
	}
}

// size is the number of buckets kept (tests).
func (l *rateLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
