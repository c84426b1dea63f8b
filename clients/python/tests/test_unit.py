"""Unit tests that need no cluster."""

import threading
import time

import pytest

import dlock
from dlock import errors
from dlock._keeper import Keeper
from dlock._transport import leader_base, normalize_endpoint
from dlock.client import _kind, escape_name


def test_error_answers_become_typed_errors():
    e = errors.from_answer(409, {"acquired": False, "error": {"code": "lock_held", "message": "held"},
                                 "holder": {"client_id": "w1", "fencing_token": 3}})
    assert isinstance(e, dlock.LockHeld) and e.holder["client_id"] == "w1" and e.status == 409
    assert isinstance(errors.from_answer(409, {"error": {"code": "wait_timeout", "message": "m"}}), dlock.WaitTimeout)
    lost = errors.from_answer(409, {"error": {"code": "lock_lost", "message": "m"}, "fencing_token": 42})
    assert isinstance(lost, dlock.LockLost) and lost.fencing_token == 42
    assert isinstance(errors.from_answer(409, {"error": {"code": "not_holder", "message": "m"}}), dlock.NotHolder)
    assert isinstance(errors.from_answer(503, {"error": {"code": "no_leader", "message": "m"}}), dlock.Unavailable)
    assert isinstance(errors.from_answer(503, {"error": {"code": "disk_full", "message": "m"}}), dlock.Unavailable)
    assert isinstance(errors.from_answer(404, {"error": {"code": "session_not_found", "message": "m"}}), dlock.SessionExpired)
    assert isinstance(errors.from_answer(502, None, "<html>bad gateway</html>"), dlock.Unavailable)
    mismatch = errors.from_answer(409, {"acquired": False, "error": {"code": "limit_mismatch", "message": "m"}, "limit": 3})
    assert isinstance(mismatch, dlock.LimitMismatch) and mismatch.limit == 3
    delayed = errors.from_answer(409, {"error": {"code": "lock_delayed", "message": "m", "retry_after_ms": 2400}})
    assert isinstance(delayed, dlock.LockDelayed) and isinstance(delayed, dlock.LockHeld) and delayed.retry_after == 2.4
    assert delayed.holder is None
    unknown = errors.from_answer(418, {"error": {"code": "teapot", "message": "m"}})
    assert type(unknown) is dlock.DlockError and unknown.code == "teapot"


def test_names_and_endpoints():
    assert escape_name("/billing/job") == "billing/job"
    assert escape_name("a b/c%d") == "a%20b/c%25d"
    with pytest.raises(dlock.InvalidArgument):
        escape_name("/")
    assert normalize_endpoint("127.0.0.1:7070", False) == "http://127.0.0.1:7070"
    assert normalize_endpoint("10.0.0.1:7070", True) == "https://10.0.0.1:7070"
    with pytest.raises(dlock.InvalidArgument):
        normalize_endpoint("http://h:1/api", False)
    # A node reached over the network naming a loopback leader means its own
    # loopback, not ours.
    assert leader_base("http://10.0.0.1:7070", "127.0.0.1:7080") == ""
    assert leader_base("http://127.0.0.1:7070", "127.0.0.1:7080") == "http://127.0.0.1:7080"
    assert leader_base("https://10.0.0.1:7070", "10.0.0.2:7070") == "https://10.0.0.2:7070"
    assert leader_base("http://10.0.0.1:7070", "0.0.0.0:7070") == ""


def test_client_checks_its_arguments():
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client([])
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client(["127.0.0.1:1"], client_id="has space")
    c = dlock.Client(["127.0.0.1:1"])
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", ttl=0.5)
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", ttl=700)
    # The lock model's fields are checked before anything is sent (the
    # endpoint is unreachable, so a request would fail otherwise).
    for bad in (0, 10_001, True, 2.5):
        with pytest.raises(dlock.InvalidArgument):
            c.semaphore("x", bad)
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", value="v" * 4097)
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", value="é" * 2049)  # 4098 bytes in UTF-8
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", lock_delay=61)
    with pytest.raises(dlock.InvalidArgument):
        c.acquire("x", lock_delay=-1)
    for reason in ("", "  ", "r" * 257):
        with pytest.raises(dlock.InvalidArgument):
            c.revoke("x", reason=reason)
    with pytest.raises(dlock.InvalidArgument):
        c.revoke("x", 0, reason="r")
    with pytest.raises(dlock.InvalidArgument):
        c.history("x", limit=0)


def test_the_kind_of_grant_becomes_the_acquire_fields():
    assert _kind(1, False, False, None, 0) == {}
    assert _kind(3, False, True, "who", 0) == {"limit": 3, "subtree": True, "value": "who"}
    assert _kind(1, True, False, None, 0) == {"mode": "shared"}
    assert _kind(1, False, False, "", 2.5) == {"lock_delay_ms": 2500}
    with pytest.raises(dlock.InvalidArgument):
        _kind(2, True, False, None, 0)  # counting locks are exclusive only


def test_keeper_sets_lost_at_the_bound_without_renewals():
    sent = time.monotonic()
    k = Keeper("lock x", 0.3, sent)
    k.start()
    assert not k.lost.is_set()
    assert k.lost.wait(5)
    # Never before sent + TTL: the server keeps the lease at least that long.
    assert time.monotonic() >= sent + 0.3
    assert isinstance(k.error, dlock.LockLost)


def test_keeper_renews_and_a_refusal_ends_it():
    calls = []

    def renew(bound):
        calls.append(bound)
        if len(calls) >= 3:
            raise dlock.NotHolder("not yours", code="not_holder")
        return time.monotonic()

    k = Keeper("lock x", 0.6, time.monotonic(), renew=renew)
    k.start()
    assert k.lost.wait(5)
    assert len(calls) == 3 and isinstance(k.error, dlock.LockLost)
    k.join()


def test_a_session_keeper_ends_its_locks():
    parent = Keeper("session", 30, time.monotonic(), renew=lambda b: time.monotonic())
    parent.start()
    child = Keeper("lock x", 30, time.monotonic(), parent=parent)
    child.start()
    parent.end(dlock.LockLost("session gone"))
    assert child.lost.wait(5) and isinstance(child.error, dlock.LockLost)
    parent.join()


def test_a_lost_grant_ends_only_that_lock_even_one_adopted_after_the_news():
    parent = Keeper("session", 30, time.monotonic(), renew=lambda b: time.monotonic())
    parent.start()
    kept, lost = Keeper("lock a", 30, time.monotonic(), parent=parent), Keeper("lock b", 30, time.monotonic(), parent=parent)
    kept.token, lost.token = 7, 8
    kept.start()
    lost.start()
    parent.lost_grant(8, dlock.LockLost("revoked"))
    assert lost.lost.is_set() and str(lost.error) == "dlock: lock_lost: revoked"
    assert not kept.lost.is_set() and not parent.lost.is_set()
    # The keepalive's news came before the Lock that got token 9 returned.
    parent.lost_grant(9, dlock.NotHolder("taken over"))
    late = Keeper("lock c", 30, time.monotonic(), parent=parent)
    late.token = 9
    late.start()
    assert late.lost.is_set() and isinstance(late.error, dlock.NotHolder)
    parent.end(dlock.LockLost("session gone"))
    assert kept.lost.wait(5)
    parent.join()


def test_a_failing_renewal_is_retried_until_the_bound():
    failures = threading.Event()

    def renew(bound):
        failures.set()
        raise dlock.Unavailable("node down")

    sent = time.monotonic()
    k = Keeper("lock x", 0.5, sent, renew=renew)
    k.start()
    assert k.lost.wait(5)
    assert failures.is_set() and time.monotonic() >= sent + 0.5
    k.join()


class _FakeClient:
    retry_timeout = 5.0


def _grant():
    from dlock.client import Grant
    return Grant("x", "me", {"fencing_token": 7, "lease_id": "ab" * 16})


def _line(send, *, wait=None, ttl=10.0, renew=None):
    """Runs _wait_in_line with send and records the clean-up calls."""
    from dlock.client import _wait_in_line
    calls = []
    out = _wait_in_line(_FakeClient(), "lock", "x", ttl, wait, None, send,
                        lambda rid: calls.append(("withdraw", rid)),
                        lambda g: calls.append(("give_back", g.fencing_token)),
                        renew or (lambda g, deadline: calls.append(("renew", g.fencing_token)) or time.monotonic()))
    return out, calls


def test_an_interrupted_wait_is_withdrawn_under_its_request_id():
    sent = []

    def send(rid, wait_ms, deadline, progress):
        sent.append(rid)
        progress["sent"] = time.monotonic()
        raise KeyboardInterrupt

    from dlock.client import _wait_in_line
    calls = []
    with pytest.raises(KeyboardInterrupt):
        _wait_in_line(_FakeClient(), "lock", "x", 10.0, None, None, send, lambda rid: calls.append(rid),
                      lambda g: None, lambda g, d: time.monotonic())
    assert calls == sent and len(sent) == 1


def test_a_refused_acquire_is_not_withdrawn_and_an_unreachable_one_is():
    def held(rid, wait_ms, deadline, progress):
        e = dlock.LockHeld("held", code="lock_held")
        e.sent = time.monotonic()
        raise e

    with pytest.raises(dlock.LockHeld):
        _line(held, wait=0)

    rids = []

    def unreachable(rid, wait_ms, deadline, progress):
        rids.append(rid)
        e = dlock.Unavailable("down")
        e.sent = time.monotonic()
        raise e

    from dlock.client import _wait_in_line
    calls = []
    with pytest.raises(dlock.Unavailable):
        _wait_in_line(_FakeClient(), "lock", "x", 10.0, 1.0, None, unreachable, lambda rid: calls.append(rid),
                      lambda g: None, lambda g, d: time.monotonic())
    assert calls == rids


def test_lock_lost_asks_again_under_a_new_request_id():
    rids = []

    def send(rid, wait_ms, deadline, progress):
        rids.append(rid)
        if len(rids) == 1:
            raise dlock.LockLost("lapsed", code="lock_lost", body={"fencing_token": 6})
        return _grant(), time.monotonic()

    (g, _), calls = _line(send)
    assert g.fencing_token == 7 and len(rids) == 2 and rids[0] != rids[1] and calls == []


def test_a_slow_grant_is_renewed_before_it_is_handed_out():
    old = time.monotonic() - 5  # sent long before: past ttl/3 of 10 s
    (g, sent), calls = _line(lambda rid, w, d, p: (_grant(), old))
    assert calls == [("renew", 7)] and sent > old


def test_waiting_asks_the_server_for_less_than_the_time_left():
    asked = []

    def send(rid, wait_ms, deadline, progress):
        asked.append(wait_ms)
        return _grant(), time.monotonic()

    _line(send, wait=5.0)
    _line(send, wait=0)
    _line(send, wait=None)
    assert 3500 <= asked[0] <= 4500 and asked[1] == 0 and asked[2] == 3_600_000


def test_a_watch_resumes_at_its_last_revision_and_skips_what_it_had():
    from dlock.watch import Watch

    w = Watch.__new__(Watch)
    w.prefix, w._from, w._skip, w._last, w._last_count, w._start = "p/", 0, 0, 0, 0, 0
    assert w._path() == "/watch?prefix=p%2F"
    w._opening("dlock watch from revision 41")
    ev = lambda rev, t: {"revision": rev, "type": t}
    # Revision 42 carries a release and the hand-off it causes; the stream
    # breaks between them.
    assert w._deliver(ev(41, "acquired")) and w._deliver(ev(42, "released"))
    # The next connection asks for 42 again and drops the one event of 42
    # it already delivered.
    assert w._path() == "/watch?prefix=p%2F&from_revision=42"
    assert not w._deliver(ev(42, "released"))
    assert w._deliver(ev(42, "acquired")) and w._deliver(ev(43, "released"))
    assert w._path().endswith("from_revision=43")
    assert not w._deliver(ev(42, "acquired"))  # older than asked: never again
    assert not w._deliver(ev(43, "released")) and w._deliver(ev(44, "acquired"))


def test_a_from_now_watch_that_broke_before_any_event_resumes_where_it_started():
    from dlock.watch import Watch

    w = Watch.__new__(Watch)
    w.prefix, w._from, w._skip, w._last, w._last_count, w._start = "", 0, 0, 0, 0, 0
    assert w._path() == "/watch"
    w._opening("dlock watch from revision 100")
    assert w._path() == "/watch?from_revision=100"


def test_the_bound_counts_from_the_send_time_of_the_last_answered_renewal():
    sent = time.monotonic()
    k = Keeper("lock x", 30, sent)
    assert k.bound == sent + 30
    k.extend(sent + 5)
    assert k.bound == sent + 35
    k.extend(sent + 1)  # an older renewal answered late moves nothing back
    assert k.bound == sent + 35
    k.end(dlock.LockLost("gone"))
    k.extend(sent + 10)  # and a lost lease never comes back
    assert k.bound == sent + 35 and k.lost.is_set()


class _Flaky:
    """A node that answers 503 twice, then 200 after a pause, recording
    what it was sent."""

    def __init__(self):
        import http.server
        import json as _json

        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((time.monotonic(), self.headers.get("X-Request-Id"), body.get("request_id")))
                if len(seen) <= 2:
                    self._answer(503, {"error": {"code": "no_leader", "message": "electing"}})
                    return
                time.sleep(0.3)
                self._answer(200, {"renewed": True})

            def do_GET(self):
                self._answer(503, {"error": {"code": "no_leader", "message": "electing"}})

            def _answer(self, status, obj):
                b = _json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_retries_keep_one_request_id_and_the_lease_counts_from_the_first_attempt():
    from dlock._transport import Transport
    node = _Flaky()
    try:
        t = Transport([node.url])
        before = time.monotonic()
        sent, ans = t.call("POST", "/locks/x/renew", {"request_id": "r-1"}, request_id="r-1",
                           deadline=time.monotonic() + 10)
        assert ans == {"renewed": True} and len(node.seen) == 3
        # Every attempt carried the same request id, in the body and the header.
        assert {(h, b) for _, h, b in node.seen} == {("r-1", "r-1")}
        # The bound starts at the first attempt, before any node acted.
        assert before <= sent <= node.seen[0][0]
        # Backed off between attempts.
        assert node.seen[1][0] > node.seen[0][0] and node.seen[2][0] > node.seen[1][0]
    finally:
        node.close()
