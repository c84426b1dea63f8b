"""Unit tests that need no cluster."""

import threading
import time

import pytest

import dlock
from dlock import errors
from dlock._keeper import Keeper
from dlock._transport import leader_base, normalize_endpoint
from dlock.client import escape_name


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
