package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/client"
)

type step struct {
	title string
	run   func(*env, context.Context) error
}

// steps are the demo's steps, in order.
var steps = map[rune]step{
	'a': {"client1 takes l1, writes to the data store, releases", (*env).stepA},
	'b': {"client2 and client3 contend for l1; client2 stops renewing", (*env).stepB},
	'c': {"all three contend for l2; the leader is killed while two wait", (*env).stepC},
	'd': {"a paused client wakes up and writes with its old token", (*env).stepD},
	'e': {"a forged token", (*env).stepE},
}

func (e *env) stepA(ctx context.Context) error {
	h, err := e.lock(ctx, "client1", "l1", e.cfg.HoldTTL)
	if err != nil {
		return err
	}
	e.say("client1 took l1: fencing token %d (TTL %s, renewed by its client)", h.l.Token(), secs(e.cfg.HoldTTL))
	if err := e.mustWrite(ctx, h.grant(), "hello from client1"); err != nil {
		return err
	}
	if err := h.unlock(ctx); err != nil {
		return err
	}
	e.say("client1 released l1")
	e.done("a. client1 took l1 with token %d, wrote (accepted) and released it", h.l.Token())
	return nil
}

func (e *env) stepB(ctx context.Context) error {
	// A raw grant is never renewed: client2 behaves like a holder that hung.
	g, err := e.clients["client2"].Acquire(ctx, "l1", client.AcquireOptions{TTL: e.cfg.ShortTTL})
	if err != nil {
		return fmt.Errorf("client2's acquire of l1: %w", err)
	}
	grantedAt := time.Now()
	g2 := grant{ClientID: g.ClientID, Lock: g.Name, FencingToken: g.FencingToken, LeaseRef: g.LeaseRef, TokenProof: g.TokenProof}
	e.say("client2 took l1 first: token %d, TTL %s, and it will never renew it", g.FencingToken, secs(e.cfg.ShortTTL))
	p3 := e.lockAsync(ctx, "client3", "l1", e.cfg.HoldTTL)
	defer p3.abandon()
	if err := e.waitQueue(ctx, "l1", 1, p3); err != nil {
		return err
	}
	e.say("client3 waits in line for l1 (wait timeout %s)", secs(e.cfg.WaitTimeout))
	if err := e.mustWrite(ctx, g2, "client2 was here"); err != nil {
		return err
	}
	h3, err := p3.result(ctx)
	if err != nil {
		return err
	}
	took := time.Since(grantedAt)
	if h3.l.Token() <= g.FencingToken {
		return fmt.Errorf("client3's token %d is not above client2's %d", h3.l.Token(), g.FencingToken)
	}
	if took < e.cfg.ShortTTL/2 {
		return fmt.Errorf("client3 got l1 %s after client2's grant with a %s TTL: it expired too early", took, e.cfg.ShortTTL)
	}
	e.say("client2's TTL ran out; %.1fs after its grant the cluster gave l1 to client3: token %d (> %d)", took.Seconds(), h3.l.Token(), g.FencingToken)
	if err := e.mustWrite(ctx, h3.grant(), "client3 took over"); err != nil {
		return err
	}
	if err := h3.unlock(ctx); err != nil {
		return err
	}
	e.done("b. client2 (token %d) let its TTL run out; client3 got l1 with token %d and wrote (accepted)", g.FencingToken, h3.l.Token())
	return nil
}
