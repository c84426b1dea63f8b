"""Semaphores, shared and subtree locks, holder values, revoke, history and
lock-delay against real `dlock serve` processes (see conftest.py)."""

from __future__ import annotations

import threading

import pytest

import dlock
from conftest import wait_for


class _InThread:
    """Runs fn in a thread and keeps its result or error, so a test can
    check that a call is still waiting and then what it returned."""

    def __init__(self, fn) -> None:
        self.result = None
        self.error = None
        self.done = threading.Event()

        def run():
            try:
                self.result = fn()
            except BaseException as e:  # the test asserts on it
                self.error = e
            finally:
                self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def get(self, within: float = 30.0):
        assert self.done.wait(within), "the call did not return in time"
        if self.error is not None:
            raise self.error
        return self.result


def _clients(cluster, *ids):
    return [dlock.Client(cluster.endpoints, client_id=i) for i in ids]


def test_a_semaphore_admits_limit_holders_and_a_fourth_waits_for_a_release(cluster):
    clients = _clients(cluster, "sem-0", "sem-1", "sem-2", "sem-3")
    sems = [c.semaphore("model/deploys", 3, ttl=10) for c in clients]
    leases = [s.acquire(wait=0) for s in sems[:3]]
    tokens = [lease.token for lease in leases]
    assert len(set(tokens)) == 3
    view = clients[0].get_lock("model/deploys")
    assert view["limit"] == 3 and sorted(h["fencing_token"] for h in view["holders"]) == sorted(tokens)
    with pytest.raises(dlock.LockHeld):
        sems[3].acquire(wait=0)
    # Every user must ask for the lock's limit; a refusal changes nothing.
    with pytest.raises(dlock.LimitMismatch) as e:
        clients[3].semaphore("model/deploys", 2).acquire(wait=0)
    assert e.value.limit == 3 and not isinstance(e.value, dlock.LockHeld)
    with pytest.raises(dlock.LimitMismatch):
        clients[3].lock("model/deploys", wait=0)

    got, leave = threading.Event(), threading.Event()
    box = {}

    def fourth():
        with sems[3] as lease:  # the context-manager form: waits for a place
            box["token"] = lease.token
            got.set()
            leave.wait(30)
        return lease

    waiter = _InThread(fourth)
    wait_for("the fourth waits in line", lambda: clients[0].get_lock("model/deploys")["waiters"] == 1)
    assert not got.is_set()
    sems[1].release(leases[1])
    assert got.wait(30), "the fourth was not granted the released place"
    assert box["token"] > max(tokens)
    holders = {h["client_id"] for h in clients[0].get_lock("model/deploys")["holders"]}
    assert holders == {"sem-0", "sem-2", "sem-3"}
    leave.set()
    assert waiter.get().released  # leaving the with block gave the place back
    for lease in (leases[0], leases[2]):
        lease.release()
    assert not clients[0].get_lock("model/deploys")["held"]
    for c in clients:
        c.close()


def test_shared_holders_coexist_while_an_exclusive_waits(cluster):
    a, b, w, late = _clients(cluster, "rw-a", "rw-b", "rw-writer", "rw-late")
    r1 = a.rwlock("model/config", ttl=10).read(wait=0)
    r2 = b.lock("model/config", ttl=10, shared=True, wait=0)
    view = a.get_lock("model/config")
    assert view["mode"] == "shared" and {h["client_id"] for h in view["holders"]} == {"rw-a", "rw-b"}
    writer = _InThread(lambda: w.rwlock("model/config", ttl=10).write(wait=30))
    wait_for("the writer waits in line", lambda: a.get_lock("model/config")["waiters"] == 1)
    # A reader that comes after a waiting writer waits behind it: writers
    # are not starved.
    with pytest.raises(dlock.LockHeld):
        late.rwlock("model/config").read(wait=0)
    r1.release()
    view = a.get_lock("model/config")
    assert [h["client_id"] for h in view["holders"]] == ["rw-b"] and view["waiters"] == 1
    assert not writer.done.is_set()
    r2.release()
    wl = writer.get()
    assert wl.token > max(r1.token, r2.token)
    view = a.get_lock("model/config")
    assert view["mode"] == "exclusive" and [h["client_id"] for h in view["holders"]] == ["rw-writer"]
    wl.release()
    for c in (a, b, w, late):
        c.close()


def test_a_subtree_holder_blocks_the_names_inside_it(cluster):
    a, b = _clients(cluster, "tree-a", "tree-b")
    with a.lock("model/tree", ttl=10, subtree=True) as top:
        with pytest.raises(dlock.LockHeld) as e:
            b.lock("model/tree/x/y", wait=0)
        assert e.value.holder["fencing_token"] == top.token and e.value.holder["lock"] == "model/tree"
        with b.lock("model/tree2", wait=0):  # a sibling name, not inside
            pass
        inner = _InThread(lambda: b.acquire("model/tree/x", ttl=10, wait=30))
        wait_for("model/tree/x waits for the subtree holder", lambda: b.get_lock("model/tree/x")["waiters"] == 1)
        assert not inner.done.is_set()
    lease = inner.get()
    assert lease.token > top.token
    lease.release()
    a.close()
    b.close()


def test_revoke_sets_the_holders_lost_and_the_waiter_gets_a_higher_token(cluster):
    holder, waiter, op = _clients(cluster, "rev-holder", "rev-waiter", "rev-operator")
    lease = holder.acquire("model/revoked", ttl=6, value="pid 1 on host-a")
    assert op.get_lock("model/revoked")["value"] == "pid 1 on host-a"
    lease.set_value("step 2 of 3")
    assert op.get_lock("model/revoked")["value"] == "step 2 of 3"
    w = _InThread(lambda: waiter.acquire("model/revoked", ttl=6, wait=30))
    wait_for("the waiter waits in line", lambda: op.get_lock("model/revoked")["waiters"] == 1)

    assert op.revoke("model/revoked", lease.token, reason="stuck in step 2") == [lease.token]
    wl = w.get()
    assert wl.token > lease.token
    # The holder learns of it at its next renewal, at most ttl/3 later.
    assert lease.lost.wait(15), "the revoked holder's lease.lost was not set"
    assert isinstance(lease.error, dlock.LockLost) and lease.error.code == "lock_lost"
    with pytest.raises(dlock.LockLost):
        lease.check()
    with pytest.raises(dlock.LockLost):
        lease.release()

    grants = op.history("model/revoked", limit=5)["grants"]
    assert grants[0]["fencing_token"] == wl.token and "end_cause" not in grants[0]
    old = next(g for g in grants if g["fencing_token"] == lease.token)
    assert old["end_cause"] == "revoked" and old["reason"] == "stuck in step 2"
    assert old["client_id"] == "rev-holder" and old["value"] == "step 2 of 3"
    assert len(op.history("model/revoked", limit=1)["grants"]) == 1
    with pytest.raises(dlock.NotFound):
        op.revoke("model/revoked", lease.token, reason="again")
    # Without a token every holder is revoked.
    assert op.revoke("model/revoked", reason="clean up") == [wl.token]
    assert wl.lost.wait(15)
    for c in (holder, waiter, op):
        c.close()


def test_an_acquire_during_a_lock_delay_raises_lock_delayed_and_a_wait_gets_it_after(cluster):
    holder, other, op = _clients(cluster, "delay-holder", "delay-other", "delay-operator")
    lease = holder.acquire("model/delayed", ttl=10, lock_delay=4)
    op.revoke("model/delayed", reason="exercise the delay")
    with pytest.raises(dlock.LockDelayed) as e:
        other.lock("model/delayed", wait=0)
    assert isinstance(e.value, dlock.LockHeld) and 0 < e.value.retry_after <= 4
    assert op.get_lock("model/delayed").get("delayed_until")
    # A wait in line keeps its place and is granted when the delay ends.
    with other.lock("model/delayed", ttl=10, wait=30) as l2:
        assert l2.token > lease.token
    grants = op.history("model/delayed")["grants"]
    assert next(g for g in grants if g["fencing_token"] == lease.token)["lock_delay_ms"] == 4000
    for c in (holder, other, op):
        c.close()


def test_a_revoke_under_a_session_sets_that_leases_lost_at_the_next_keepalive(cluster):
    holder, op = _clients(cluster, "sess-holder", "sess-operator")
    # A session TTL far longer than the waits below would allow, were lost
    # set only when the session is lost: the keepalive (every ttl/3) must
    # report the revoke.
    s = holder.session(ttl=9)
    job = holder.acquire("model/sess/job", session=s)
    other = holder.acquire("model/sess/other", session=s)
    lead = holder.election("model/sess/leader", session=s).campaign("me")

    assert op.revoke("model/sess/job", job.token, reason="stuck") == [job.token]
    assert job.lost.wait(20), "the revoked session-held lease's lost was not set"
    assert isinstance(job.error, dlock.LockLost) and job.error.code == "lock_lost"
    assert job.error.fencing_token == job.token and "stuck" in str(job.error)
    # Only that grant ended: the session and its other lock live on.
    assert not s.lost.is_set() and not other.lost.is_set()
    assert op.get_lock("model/sess/other")["holder"]["fencing_token"] == other.token

    assert op.revoke("model/sess/leader", reason="drill", election=True) == [lead.token]
    assert lead.lost.wait(20), "the revoked session-held leadership's lost was not set"
    assert lead.error.code == "lock_lost"

    # The same client id takes model/sess/other over under a lease of its
    # own: the session's grant ends with NotHolder.
    again = dlock.Client(cluster.endpoints, client_id="sess-holder")
    taken = again.acquire("model/sess/other", ttl=6, takeover=True)
    assert taken.token > other.token
    assert other.lost.wait(20), "the taken-over session-held lease's lost was not set"
    assert isinstance(other.error, dlock.NotHolder)
    assert not s.lost.is_set()
    taken.release()
    s.close()
    for c in (holder, op, again):
        c.close()
