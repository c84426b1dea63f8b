package demo

import (
	"context"
	"fmt"
	"time"
)

// stepC is the demo's leader crash: the queue lives in the replicated
// state, so the waiters keep their places and the new leader serves them.
func (e *env) stepC(ctx context.Context) error {
	h1, err := e.lock(ctx, "client1", "l2", e.cfg.HoldTTL)
	if err != nil {
		return err
	}
	e.say("client1 holds l2: token %d", h1.l.Token())
	// Queue one at a time, so the order in line is known.
	p2 := e.lockAsync(ctx, "client2", "l2", e.cfg.HoldTTL)
	defer p2.abandon()
	if err := e.waitQueue(ctx, "l2", 1, p2); err != nil {
		return err
	}
	p3 := e.lockAsync(ctx, "client3", "l2", e.cfg.HoldTTL)
	defer p3.abandon()
	if err := e.waitQueue(ctx, "l2", 2, p3); err != nil {
		return err
	}
	e.say("client2 waits for l2, first in line; client3 waits, second")

	leader, err := e.waitLeader(ctx, e.alive())
	if err != nil {
		return err
	}
	killedAt := time.Now()
	if err := leader.p.kill(); err != nil {
		return err
	}
	e.say("SIGKILL the leader %s (pid %d) while client2 and client3 wait", leader.id, leader.p.Pid())
	newLeader, err := e.waitLeader(ctx, e.alive())
	if err != nil {
		return fmt.Errorf("no new leader after killing %s: %w", leader.id, err)
	}
	if err := e.checkHolder(ctx, "l2", "client1", h1.l.Token(), 2); err != nil {
		return fmt.Errorf("after the failover: %w", err)
	}
	e.say("%s is the new leader, %.1fs after the kill; l2 is still client1's (token %d) with 2 in line",
		newLeader.id, time.Since(killedAt).Seconds(), h1.l.Token())

	if err := h1.unlock(ctx); err != nil {
		return err
	}
	e.say("client1 released l2 through the surviving nodes")
	select {
	case <-p2.done:
	case <-p3.done:
	case <-ctx.Done():
		return fmt.Errorf("neither waiter got l2 after client1's release: %w", ctx.Err())
	}
	if p3.granted() {
		return fmt.Errorf("client3 got l2 before client2, who queued first: the FIFO order was lost in the failover")
	}
	h2, err := p2.result(ctx)
	if err != nil {
		return err
	}
	if h2.l.Token() <= h1.l.Token() {
		return fmt.Errorf("client2's token %d is not above client1's %d", h2.l.Token(), h1.l.Token())
	}
	if err := e.checkHolder(ctx, "l2", "client2", h2.l.Token(), 1); err != nil {
		return err
	}
	e.say("the new leader handed l2 to client2, first in line: token %d; client3 still waits", h2.l.Token())
	if err := h2.unlock(ctx); err != nil {
		return err
	}
	h3, err := p3.result(ctx)
	if err != nil {
		return err
	}
	if h3.l.Token() <= h2.l.Token() {
		return fmt.Errorf("client3's token %d is not above client2's %d", h3.l.Token(), h2.l.Token())
	}
	e.say("client2 released; client3, second in line, got l2: token %d", h3.l.Token())
	if err := h3.unlock(ctx); err != nil {
		return err
	}
	e.done("c. leader %s killed with 2 in line for l2; new leader %s served client2 (token %d), then client3 (token %d)",
		leader.id, newLeader.id, h2.l.Token(), h3.l.Token())
	return nil
}
