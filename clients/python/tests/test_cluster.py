"""The client against real `dlock serve` processes (see conftest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import urllib.request

import pytest

import dlock
from dlock import fence
from conftest import free_addr, get_json, wait_for


def test_two_processes_never_hold_one_lock_at_once_and_tokens_rise(cluster, scripts, tmp_path):
    log = tmp_path / "sections.log"
    eps = ",".join(cluster.endpoints)
    workers = [scripts("worker.py", eps, "mutex/one", str(log), "12", f"worker-{i}") for i in range(2)]
    for w in workers:
        assert w.expect("DONE", within=90) == ""
        assert w.wait() == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * 2 * 12
    last_token = 0
    for i in range(0, len(lines), 2):
        start, end = lines[i].split(), lines[i + 1].split()
        # A section is never interleaved with another's.
        assert start[0] == "start" and end[0] == "end" and start[1:] == end[1:], lines[i:i + 2]
        token = int(start[2])
        assert token > last_token, "fencing tokens must rise from one holder to the next"
        last_token = token


def test_lock_held_wait_timeout_and_reads(cluster):
    a = dlock.Client(cluster.endpoints, client_id="reader-a")
    b = dlock.Client(cluster.endpoints[::-1], client_id="reader-b")
    with a.lock("reads/x", ttl=10) as lease:
        with pytest.raises(dlock.LockHeld) as e:
            b.lock("reads/x", wait=0)
        assert not isinstance(e.value, dlock.WaitTimeout) and e.value.holder["client_id"] == "reader-a"
        with pytest.raises(dlock.WaitTimeout):
            b.lock("reads/x", wait=0.3)
        view = b.get_lock("reads/x")
        assert view["held"] and view["holder"]["fencing_token"] == lease.token
        locks, rev = b.list_locks("reads/")
        assert [l["name"] for l in locks] == ["reads/x"] and rev >= view["revision"]
    assert not b.get_lock("reads/x")["held"]
    with pytest.raises(dlock.LockLost):
        lease.check()
    # A session holds many locks; closing it releases them.
    with a.session(ttl=5) as s:
        l1, l2 = a.acquire("reads/s1", session=s), a.acquire("reads/s2", session=s)
        assert b.get_lock("reads/s2")["holder"]["client_id"] == "reader-a"
    assert l1.lost.is_set() and l2.lost.is_set()
    wait_for("the session's locks are released", lambda: not b.get_lock("reads/s1")["held"])
    # Closing a client stops its leases: lost is set, nothing is released.
    c = dlock.Client(cluster.endpoints, client_id="reader-c")
    held = c.acquire("reads/closed", ttl=5)
    c.close()
    assert held.lost.is_set() and isinstance(held.error, dlock.LockLost)
    assert b.get_lock("reads/closed")["holder"]["client_id"] == "reader-c"
    with pytest.raises(dlock.ClientClosed):
        c.acquire("reads/other")


def test_a_paused_holder_sees_lease_lost_and_its_late_write_is_refused(cluster, scripts, dlock_bin, tmp_path):
    store_addr = free_addr()
    store = subprocess.Popen([dlock_bin, "datastore", "--addr", store_addr, "--data-dir", str(tmp_path),
                              "--cluster", cluster.endpoints[0], "--log-level", "warn"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store_url = "http://" + store_addr
        wait_for("the data store answers", lambda: get_json(store_url + "/healthz")[0] == 200)
        eps = ",".join(cluster.endpoints)
        writer = scripts("paused_writer.py", eps, "fenced/l", "paused-1", store_url)
        token1, ref1, proof1 = writer.expect("GRANTED").split()
        os.kill(writer.proc.pid, signal.SIGSTOP)
        try:
            # Another client waits for the lock and gets it once the frozen
            # holder's lease has run out.
            c2 = dlock.Client(cluster.endpoints, client_id="second")
            with c2.lock("fenced/l", ttl=10, wait=30) as lease:
                assert lease.token > int(token1)
                status = _write(store_url, "second", "fenced/l", lease, "from the new holder")
                assert status == 200
                # Python fences the same way: the proofs verify against the
                # cluster's keys, and the checker refuses the older token.
                keys = fence.KeySet.fetch(cluster.endpoints[1])
                keys.verify("fenced/l", lease.token, "second", lease.lease_ref, lease.token_proof)
                keys.verify("fenced/l", int(token1), "paused-1", ref1, proof1)
                with pytest.raises(fence.BadSignature):
                    keys.verify("fenced/l", lease.token + 1, "second", lease.lease_ref, lease.token_proof)
                checker = fence.Checker(str(tmp_path / "py-fence.db"))
                checker.check("fenced/l", lease.token, "second/" + lease.lease_ref)
                with pytest.raises(fence.StaleToken):
                    checker.check("fenced/l", int(token1), "paused-1/" + ref1)
        finally:
            os.kill(writer.proc.pid, signal.SIGCONT)
        writer.send("write")
        assert writer.expect("LOST") == "True LockLost"
        assert writer.expect("WROTE") == "409"
        assert writer.wait() == 0
    finally:
        store.terminate()
        store.wait(10)


def _write(store_url, client_id, lock, lease, data) -> int:
    body = json.dumps({"client_id": client_id, "lock": lock, "fencing_token": lease.token, "lease_ref": lease.lease_ref,
                       "token_proof": lease.token_proof, "data": data}).encode()
    req = urllib.request.Request(store_url + "/write", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_killing_the_leader_during_a_blocking_acquire_still_grants_exactly_once(own_cluster, scripts):
    c = dlock.Client(own_cluster.endpoints, client_id="observer")
    _, rev = c.list_locks()
    eps = ",".join(own_cluster.endpoints)
    holder = scripts("holder.py", eps, "failover/job", "holder-a")
    token_a = int(holder.expect("GRANTED"))
    waiter = scripts("waiter.py", eps, "failover/job", "waiter-b")
    waiter.expect("WAITING")
    wait_for("waiter-b waits in line", lambda: c.get_lock("failover/job")["waiters"] == 1)
    old = own_cluster.leader()
    own_cluster.kill(old)
    new = own_cluster.leader()
    assert new.id != old.id
    # The holder keeps its lease across the failover (it renews every
    # TTL/3 and retries on the survivors), and the waiter keeps its place.
    live = dlock.Client([n.url for n in own_cluster.nodes if n.alive()], client_id="observer")
    first = wait_for("the new leader still shows the lock held by holder-a with waiter-b in line", lambda: (
        (v := live.get_lock("failover/job"))["held"] and v["holder"]["client_id"] == "holder-a" and v["waiters"] == 1 and v))
    # The holder renews (every TTL/3) through the new leader.
    wait_for("holder-a renews through the new leader", lambda: (
        live.get_lock("failover/job")["holder"]["expires_at"] != first["holder"]["expires_at"]))
    holder.send("release")
    assert holder.expect("DONE") == "False", "the holder's lease must not be lost across a failover"
    token_b = int(waiter.expect("GRANTED"))
    assert token_b > token_a
    waiter.expect("DONE")
    assert holder.wait() == 0 and waiter.wait() == 0
    # Exactly one grant to the waiter, whatever the retries.
    grants = []
    with live.watch("failover/", from_revision=rev + 1) as w:
        for ev in w:
            if ev["type"] == "acquired" and ev["client_id"] == "waiter-b":
                grants.append(ev["fencing_token"])
            if ev["type"] == "released" and ev["client_id"] == "waiter-b":
                break
    assert grants == [token_b]


def test_an_observer_sees_every_leader_change(cluster):
    clients = [dlock.Client(cluster.endpoints, client_id=f"cand-{i}") for i in range(3)]
    election = clients[0].election("obs/svc", ttl=10)
    views, done = [], threading.Event()
    obs = election.observe()

    def observe():
        for v in obs:
            views.append(v)
            if v["leader"] is None and any((x["leader"] or {}).get("candidate_id") == "cand-2" for x in views):
                done.set()
                return

    t = threading.Thread(target=observe, daemon=True)
    t.start()
    wait_for("the observer's first view", lambda: views)
    l0 = clients[0].election("obs/svc", ttl=10).campaign("v0")
    l1_box = {}
    waiting = threading.Thread(target=lambda: l1_box.setdefault("l", clients[1].election("obs/svc", ttl=10).campaign("v1")))
    waiting.start()
    wait_for("cand-1 waits in line", lambda: election.view()["campaigners"] == 1)
    l0.proclaim("v0b")
    l0.resign()  # cand-1 is elected in the same step
    waiting.join(10)
    l1 = l1_box["l"]
    l1.resign()
    with clients[2].election("obs/svc", ttl=10).campaign("v2") as l2:
        assert l2.token > l1.token > l0.token
    assert done.wait(20), views
    obs.close()
    leaders = []
    for v in views:
        who = (v["leader"] or {}).get("candidate_id")
        if who and (not leaders or leaders[-1] != who):
            leaders.append(who)
    assert leaders == ["cand-0", "cand-1", "cand-2"], views
    assert any((v["leader"] or {}).get("value") == "v0b" for v in views), "the proclaimed value was not observed"
    assert [v["revision"] for v in views] == sorted(v["revision"] for v in views)


def test_a_watch_across_a_node_kill_sees_every_event_once(own_cluster):
    c = dlock.Client(own_cluster.endpoints, client_id="watcher")
    _, rev = c.list_locks()
    got = []
    w = c.watch("wk/", from_revision=rev + 1)

    def follow():
        for ev in w:
            got.append(ev)

    t = threading.Thread(target=follow, daemon=True)
    t.start()

    def churn(client, n, tag):
        for i in range(n):
            with client.lock(f"wk/{tag}{i % 3}", ttl=5):
                pass

    churn(c, 9, "a")
    wait_for("the watch saw the first events", lambda: len(got) >= 18)
    # The watch follows the leader; kill it.
    own_cluster.kill(own_cluster.leader())
    own_cluster.leader()
    live = [n.url for n in own_cluster.nodes if n.alive()]
    c2 = dlock.Client(live, client_id="writer-2")
    churn(c2, 9, "b")
    _, last = c2.list_locks()
    wait_for("the watch resumed and saw every later event", lambda: got and got[-1]["revision"] >= last and len(got) >= 36, within=60)
    w.close()
    t.join(10)
    # The reference: a fresh watch on a survivor over the same revisions.
    ref = []
    with dlock.Client(live, client_id="ref").watch("wk/", from_revision=rev + 1) as rw:
        for ev in rw:
            ref.append(ev)
            if len(ref) == len(got):
                break
    key = lambda e: (e["revision"], e["type"], e.get("name"), e.get("client_id"), e.get("fencing_token"))
    assert [key(e) for e in got] == [key(e) for e in ref]
    assert len({key(e) for e in got}) == len(got), "an event was delivered twice"
    assert len(got) == 36


def test_election_proofs_verify_against_the_cluster_keys(cluster):
    pytest.importorskip("cryptography")
    c = dlock.Client(cluster.endpoints, client_id="proof-cand")
    keys = fence.KeySet.parse(json.dumps(c.token_keys()))
    with c.election("proofs/svc", ttl=5).campaign("v") as ld:
        # An election's proof signs the key "@e/<name>".
        keys.verify("@e/proofs/svc", ld.token, "proof-cand", ld.lease_ref, ld.token_proof)
        with pytest.raises(fence.BadSignature):
            keys.verify("proofs/svc", ld.token, "proof-cand", ld.lease_ref, ld.token_proof)
    assert fence.lease_ref(ld.lease_id) == ld.lease_ref


def test_an_interrupted_wait_leaves_nothing_behind(cluster, scripts):
    c = dlock.Client(cluster.endpoints, client_id="holds-it")
    with c.lock("interrupt/x", ttl=10):
        waiter = scripts("interrupted.py", ",".join(cluster.endpoints), "interrupt/x", "gives-up")
        waiter.expect("WAITING")
        wait_for("the waiter is in line", lambda: c.get_lock("interrupt/x")["waiters"] == 1)
        waiter.proc.send_signal(signal.SIGINT)
        waiter.expect("INTERRUPTED")
        assert waiter.wait() == 0
        # Withdrawn before the script went on: nobody waits any more.
        assert c.get_lock("interrupt/x")["waiters"] == 0
    # Released with nobody in line: the lock is free, not handed to the
    # client that gave up.
    assert not c.get_lock("interrupt/x")["held"]


def test_an_observer_follows_the_election_across_a_node_kill(own_cluster):
    eps = own_cluster.endpoints
    obs_client = dlock.Client(eps, client_id="obs")
    views = []
    obs = obs_client.election("failover/svc").observe()
    t = threading.Thread(target=lambda: [views.append(v) for v in obs], daemon=True)
    t.start()
    wait_for("the first view", lambda: views)
    a = dlock.Client(eps, client_id="cand-a").election("failover/svc", ttl=10).campaign("a")
    wait_for("the observer saw cand-a", lambda: any((v["leader"] or {}).get("candidate_id") == "cand-a" for v in views))
    # The observation follows the leader; kill it.
    own_cluster.kill(own_cluster.leader())
    own_cluster.leader()
    live = [n.url for n in own_cluster.nodes if n.alive()]
    b_box = {}
    waiting = threading.Thread(target=lambda: b_box.setdefault(
        "l", dlock.Client(live, client_id="cand-b").election("failover/svc", ttl=10).campaign("b")))
    waiting.start()
    wait_for("cand-b waits in line", lambda: dlock.Client(live, client_id="x").election("failover/svc").view()["campaigners"] == 1)
    a.resign()
    waiting.join(30)
    b = b_box["l"]
    assert b.token > a.token
    wait_for("the observer saw cand-b elected after the kill", lambda: any(
        (v["leader"] or {}).get("candidate_id") == "cand-b" for v in views), within=60)
    b.resign()
    obs.close()
    t.join(10)
    leaders = []
    for v in views:
        who = (v["leader"] or {}).get("candidate_id")
        if who and (not leaders or leaders[-1] != who):
            leaders.append(who)
    assert leaders == ["cand-a", "cand-b"], views
    revs = [v["revision"] for v in views]
    assert revs == sorted(revs), "a view went back in time across the resume"
