"""Leader elections: campaign, observe, proclaim, resign."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Iterator, Optional, Tuple

from . import errors
from ._sse import Stream
from ._transport import new_request_id
from .client import CLEANUP_TIMEOUT, Grant, Session, _Held, _wait_in_line, check_ttl, escape_name, log


class Election:
    """A leader election: campaigners wait in the server's FIFO queue, and
    when the leader resigns or its lease ends the next one is elected in the
    same step, with a new fencing token."""

    def __init__(self, client: Any, name: str, ttl: float, session: Optional[Session]) -> None:
        self._c = client
        self.name = name.lstrip("/")
        self._path = "/elections/" + escape_name(name)
        self.ttl = ttl
        self._session = session
        if session is None:
            check_ttl(ttl)

    def campaign(self, value: str, *, wait: Optional[float] = None, takeover: bool = False) -> "Leadership":
        """Waits in line until this client is elected with value (``wait``
        as for Client.lock). The leadership renews itself every ttl/3 and sets
        ``lost`` as a Lease does. Resign when done (or use ``with``)."""
        c, s = self._c, self._session
        c._check_open()

        def body(rid: str, wait_ms: int, take: bool) -> Dict[str, Any]:
            b: Dict[str, Any] = {"candidate_id": c.client_id, "value": value, "request_id": rid}
            if s is not None:
                b["session_id"] = s.id
            else:
                b["ttl_ms"] = check_ttl(self.ttl)
            if wait_ms > 0:
                b["wait_timeout_ms"] = wait_ms
            if take:
                b["takeover"] = True
            return b

        def send(rid: str, wait_ms: int, deadline: Optional[float], progress: Dict[str, Any]) -> Tuple[Grant, float]:
            sent, ans = c._t.call("POST", self._path + "/campaign", body(rid, wait_ms, takeover), request_id=rid,
                                  attempt_timeout=c.request_timeout + wait_ms / 1000, deadline=deadline,
                                  what=f"campaign {self.name!r}", progress=progress)
            if not isinstance(ans, dict) or not ans.get("leader") or not ans.get("fencing_token"):
                raise errors.DlockError(f"campaign {self.name!r}: the server answered 2xx without electing")
            return Grant(self.name, c.client_id, ans), sent if sent is not None else time.monotonic()

        def withdraw(rid: str) -> None:
            try:
                _, ans = c._t.call("POST", self._path + "/campaign", body(rid, 0, False), request_id=rid,
                                   deadline=time.monotonic() + CLEANUP_TIMEOUT, what=f"withdraw campaign {self.name!r}")
            except (errors.LockHeld, errors.LockLost):
                return
            except errors.DlockError as e:
                log.warning("dlock: could not withdraw an abandoned campaign in %s: %s", self.name, e)
                return
            if isinstance(ans, dict) and ans.get("leader"):
                give_back(Grant(self.name, c.client_id, ans))

        def give_back(g: Grant) -> None:
            try:
                self._holder_call("resign", g.fencing_token, g.lease_id, deadline=time.monotonic() + CLEANUP_TIMEOUT)
            except errors.NotHolder:
                pass
            except errors.DlockError as e:
                log.warning("dlock: could not resign an unused seat in %s; it ends after its TTL: %s", self.name, e)

        def renew(g: Grant, deadline: float) -> float:
            return self._holder_call("renew", g.fencing_token, g.lease_id, deadline=deadline)

        g, sent = _wait_in_line(c, "campaign", self.name, self.ttl if s is None else 0.0, wait, s, send, withdraw, give_back, renew)
        keeper = c._lease_keeper(f"leadership of {self.name}", self.ttl, sent, s,
                                 lambda bound: self._holder_call("renew", g.fencing_token, g.lease_id, deadline=bound,
                                                                 attempt_timeout=keeper.attempt_timeout()),
                                 g.fencing_token)
        try:
            c._track(keeper)
        except errors.ClientClosed:
            give_back(g)
            raise
        keeper.start()
        return Leadership(self, g, keeper, value)

    def _holder_call(self, action: str, token: int, lease_id: str, *, deadline: Optional[float] = None,
                     value: Optional[str] = None, attempt_timeout: Optional[float] = None) -> float:
        rid = new_request_id()
        b: Dict[str, Any] = {"candidate_id": self._c.client_id, "fencing_token": token, "lease_id": lease_id, "request_id": rid}
        if value is not None:
            b["value"] = value
        sent, _ = self._c._t.call("POST", f"{self._path}/{action}", b, request_id=rid, attempt_timeout=attempt_timeout,
                                  deadline=deadline or self._c._deadline(), what=f"{action} in election {self.name!r}")
        return sent if sent is not None else time.monotonic()

    def leader(self, *, stale: bool = False) -> Optional[Dict[str, Any]]:
        """The current leader ``{"candidate_id", "value", "fencing_token",
        "since", "expires_at"}``, or None while the seat is empty."""
        _, ans = self._c._t.call("GET", self._path + ("?stale=true" if stale else ""), deadline=self._c._deadline())
        return ans.get("leader")

    def view(self) -> Dict[str, Any]:
        """The whole state: ``{"name", "leader", "campaigners", "revision"}``."""
        _, ans = self._c._t.call("GET", self._path, deadline=self._c._deadline())
        return ans

    def observe(self) -> "Observation":
        """The election's state now, then after every change — a new leader,
        a proclaimed value, a change in the line, and a vacancy (``leader``
        None) whenever the seat is empty — as an iterator of views. A broken
        stream resumes on another node; a view that says nothing new is not
        repeated, and no view older than one already yielded is."""
        return Observation(self._c, self._path, self.name)


class Observation:
    """An iterator of election views; close() (or ``with``) ends it."""

    def __init__(self, client: Any, path: str, name: str) -> None:
        self._fresh = False
        self._last: Optional[Dict[str, Any]] = None

        def p() -> str:
            self._fresh = True
            return path + "?observe=true"

        self._stream = Stream(client._t, f"observe election {name}", p)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for rec in self._stream.records():
            if rec.event != "leader":
                continue
            v = json.loads(rec.data)
            first, self._fresh = self._fresh, False
            last = self._last
            if last is not None:
                if v["revision"] < last["revision"]:
                    continue  # older than what the caller saw
                if _same(v, last) and (first or v["revision"] == last["revision"]):
                    last["revision"] = v["revision"]  # a reconnect's view that says nothing new
                    continue
            self._last = v
            yield v

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _same(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    la, lb = a.get("leader"), b.get("leader")
    if a.get("campaigners") != b.get("campaigners") or (la is None) != (lb is None):
        return False
    return la is None or (la["candidate_id"] == lb["candidate_id"] and la["fencing_token"] == lb["fencing_token"]
                          and la.get("value") == lb.get("value"))


class Leadership(_Held):
    """One won election. It renews itself every TTL/3 (or lives as long as
    its session) until resigned or lost; ``lost`` is set as for a Lease."""

    def __init__(self, election: Election, grant: Grant, keeper: Any, value: str) -> None:
        super().__init__(election._c, grant, keeper)
        self._e = election
        self.value = value

    def proclaim(self, value: str) -> None:
        """Changes the leader's value without an election. Raises LockLost
        once the leadership is lost (NotHolder if the server says so, which
        also ends it)."""
        self.check()
        try:
            self._e._holder_call("proclaim", self.token, self.lease_id, value=value)
        except errors.NotHolder as e:
            self._keeper.end(errors.LockLost(f"leadership of {self.name} lost: {e}", code=e.code, body=e.body))
            raise
        self.value = value

    def resign(self) -> None:
        """Stops renewing and gives the seat up; the next in line is elected
        at once. Resigning twice does nothing."""
        if not self._stop():
            return
        lost = self.error
        try:
            self._e._holder_call("resign", self.token, self.lease_id)
        except errors.NotHolder:
            if lost is not None:
                raise lost from None
            raise

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self.error
        try:
            self.resign()
        except errors.LockLost:
            pass
        except errors.DlockError as e:
            log.warning("dlock: could not resign %s; it ends after its TTL: %s", self.name, e)
        if exc_type is None and lost is not None:
            raise lost

    def __repr__(self) -> str:
        return f"<dlock.Leadership {self.name!r} token={self.token} lost={self.lost.is_set()}>"
