"""The dlock client: locks, sessions, reads. Elections are in election.py,
watches in watch.py."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple
from urllib.parse import quote, urlencode

from . import errors
from ._keeper import Keeper
from ._transport import BACKOFF_MAX, BACKOFF_MIN, Transport, jitter, new_request_id

if TYPE_CHECKING:  # imported for the annotations only: they import this module
    from .election import Election
    from .watch import Watch

log = logging.getLogger("dlock")

#: The server's limits on a lease TTL and on one wait in line (seconds).
MIN_TTL, MAX_TTL, MAX_WAIT = 1.0, 600.0, 3600.0
#: The most a wait in line asks the server for less than the time it has
#: left, so that the server says wait_timeout before the client gives up.
WAIT_MARGIN = 1.0
#: Bounds the clean-up after an abandoned acquire.
CLEANUP_TIMEOUT = 3.0


def escape_name(name: str) -> str:
    """A lock or election name as a URL path, each segment escaped on its own
    so the slashes stay readable in server logs."""
    name = name[1:] if name.startswith("/") else name
    if not name:
        raise errors.InvalidArgument("lock name is empty")
    return "/".join(quote(seg, safe="") for seg in name.split("/"))


def check_ttl(ttl: float) -> int:
    ms = round(ttl * 1000)
    if not (MIN_TTL <= ttl <= MAX_TTL):
        raise errors.InvalidArgument(f"ttl {ttl:g} s: use {MIN_TTL:g} to {MAX_TTL:g} seconds")
    return ms


def check_id(field: str, v: str) -> None:
    if not 1 <= len(v) <= 128 or any(not 0x21 <= ord(c) <= 0x7E for c in v):
        raise errors.InvalidArgument(f"{field} {v!r}: use 1 to 128 printable ASCII characters without spaces")


def default_client_id() -> str:
    """Unique per process, and says where the holder runs, which is what an
    operator looking at GET /locks wants to know."""
    host = "".join(c if 0x20 < ord(c) < 0x7F else "_" for c in socket.gethostname())[:80] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


class Grant:
    """A grant as the server answered it: what a fenced resource needs."""

    def __init__(self, name: str, client_id: str, answer: Dict[str, Any]) -> None:
        self.name = name
        self.client_id = client_id
        self.fencing_token: int = int(answer["fencing_token"])
        self.lease_id: str = str(answer["lease_id"])
        self.lease_ref: str = str(answer.get("lease_ref", ""))
        self.token_proof: str = str(answer.get("token_proof", ""))
        self.expires_at: str = str(answer.get("expires_at", ""))
        self.revision: int = int(answer.get("revision", 0))


class _Held:
    """A grant this client keeps, a lock's (Lease) or an election's
    (Leadership)."""

    def __init__(self, client: "Client", grant: Grant, keeper: Keeper) -> None:
        self._client = client
        self._grant = grant
        self._keeper = keeper
        self._released = False
        self._mu = threading.Lock()

    @property
    def name(self) -> str:
        return self._grant.name

    @property
    def token(self) -> int:
        """The fencing token: pass it to the resource the lock protects, so
        it can refuse writes from an older holder."""
        return self._grant.fencing_token

    fencing_token = token

    @property
    def token_proof(self) -> str:
        """The cluster's signature of this grant, for a fenced resource
        (dlock.fence; docs/fencing.md)."""
        return self._grant.token_proof

    @property
    def lease_ref(self) -> str:
        """The public reference to this grant's lease that the proof binds.
        Send it with the token and proof; never send the lease id."""
        return self._grant.lease_ref

    @property
    def lease_id(self) -> str:
        """The lease's id: a secret that can renew and release the grant."""
        return self._grant.lease_id

    @property
    def client_id(self) -> str:
        return self._grant.client_id

    @property
    def lost(self) -> threading.Event:
        """Set the moment this client can no longer be sure it holds the
        grant — no renewal answered within the TTL of the last one that was
        (counted from when that one was sent, so strictly before the server
        can give it to anyone else), the server said it is not the holder, or
        its session ended — and when it is released. From then on another
        client may hold it. An operator's revoke is the one exception, which
        fencing tokens cover."""
        return self._keeper.lost

    @property
    def error(self) -> Optional[BaseException]:
        """Why lost was set: a LockLost, or None after a release."""
        e = self._keeper.error
        return None if isinstance(e, _Released) else e

    @property
    def released(self) -> bool:
        return self._released

    def remaining(self) -> float:
        """Seconds until the client counts the grant lost unless a renewal is
        answered (0 once lost)."""
        if self.lost.is_set():
            return 0.0
        return max(0.0, self._keeper.bound - time.monotonic())

    def check(self) -> None:
        """Raises LockLost if the grant was lost (or released)."""
        if self.lost.is_set():
            raise self.error or errors.LockLost(f"{self.name}: released")

    def _stop(self) -> bool:
        """Stops renewing; reports whether this call did (False after an
        earlier release)."""
        with self._mu:
            if self._released:
                return False
            self._released = True
        self._keeper.end(_Released(f"{self.name}: released"))
        self._keeper.join()
        return True


class _Released(errors.DlockError):
    """The keeper's error after a release (not a loss)."""


class Lease(_Held):
    """One holding of a lock. It renews itself every TTL/3 (or, under a
    session, lives as long as the session) until released or lost.

    Use it as a context manager (``with client.lock(...) as lease``), or call
    release() when done."""

    def release(self) -> None:
        """Stops renewing and gives the lock back; the next in line gets it
        at once. Raises LockLost if the lease had been lost (the server no
        longer counted this client as the holder). Releasing twice does
        nothing."""
        if not self._stop():
            return
        lost = self.error
        try:
            self._client._release(self.name, self.token, self.lease_id)
        except errors.NotHolder:
            if lost is not None:
                raise lost from None
            raise

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self.error
        try:
            self.release()
        except errors.LockLost:
            pass
        except errors.DlockError as e:
            # The block's work is done; a failed release only delays the
            # next holder until the TTL runs out.
            log.warning("dlock: could not release %s; it expires after its TTL: %s", self.name, e)
        if exc_type is None and lost is not None:
            # The block ran (part of the time) without the lock.
            raise lost

    def __repr__(self) -> str:
        return f"<dlock.Lease {self.name!r} token={self.token} lost={self.lost.is_set()}>"


class Session:
    """A lease kept alive every TTL/3 by the client, to hold many locks
    (``client.lock(name, session=s)``): they are lost together when it is,
    and released when it is closed."""

    def __init__(self, client: "Client", session_id: str, ttl: float, sent: float) -> None:
        self._client = client
        self._id = session_id
        self.ttl = ttl

        def renew(bound: float) -> float:
            rid = new_request_id()
            sent, _ = client._t.call("POST", self._path() + "/keepalive", {"client_id": client.client_id, "request_id": rid},
                                     request_id=rid, attempt_timeout=self._keeper.attempt_timeout(), deadline=bound,
                                     what="POST /sessions/{id}/keepalive")
            return sent if sent is not None else time.monotonic()

        self._keeper = Keeper("session", ttl, sent, renew=renew, attempt_timeout=client.request_timeout)
        client._track(self._keeper)
        self._keeper.start()

    def _path(self) -> str:
        return "/sessions/" + quote(self._id, safe="")

    @property
    def id(self) -> str:
        """The session's id: a secret."""
        return self._id

    @property
    def lost(self) -> threading.Event:
        """Set when the session may be lost (no keepalive answered within
        the TTL, or the server no longer knows it) and when it is closed."""
        return self._keeper.lost

    @property
    def error(self) -> Optional[BaseException]:
        e = self._keeper.error
        return None if isinstance(e, _Released) else e

    def close(self) -> None:
        """Stops the keepalive and deletes the session, which releases its
        locks (each handed to its next waiter) and drops its waits."""
        self._keeper.end(_Released("session closed"))
        self._keeper.join()
        rid = new_request_id()
        try:
            self._client._t.call("DELETE", self._path(), {"client_id": self._client.client_id, "request_id": rid},
                                 request_id=rid, deadline=time.monotonic() + self._client.retry_timeout,
                                 what="DELETE /sessions/{id}")
        except errors.SessionExpired:
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client:
    """A connection to a dlock cluster. Safe for use from many threads.

    ``endpoints`` are base URLs of some or all nodes ("http://10.0.0.1:7070";
    a bare "host:port" means http, or https with ``ssl_context``). Requests go
    to the leader when it is known and fail over to any other node; each
    logical request keeps one request id across its retries, which back off
    with jitter, so a retry never acts twice.

    ``client_id`` names this holder (default: host-pid-random; give each
    process its own). ``token`` is an ACL token's secret. ``request_timeout``
    bounds one attempt of a request that does not wait in line;
    ``retry_timeout`` how long a request that does not wait in line is
    retried before it fails with Unavailable.
    """

    def __init__(self, endpoints: "List[str] | str", *, client_id: str = "", token: str = "",
                 request_timeout: float = 10.0, retry_timeout: float = 30.0,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self._t = Transport(list(endpoints), token=token, request_timeout=request_timeout,
                            ssl_context=ssl_context, logger=log)
        self.client_id = client_id or default_client_id()
        check_id("client_id", self.client_id)
        self.request_timeout = request_timeout
        self.retry_timeout = retry_timeout
        self._live: "weakref.WeakSet[Keeper]" = weakref.WeakSet()
        self._live_mu = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClientClosed("the client is closed")

    def _track(self, k: Keeper) -> None:
        with self._live_mu:
            if self._closed:
                raise errors.ClientClosed("the client is closed")
            self._live.add(k)

    @property
    def endpoints(self) -> List[str]:
        return list(self._t.endpoints)

    def _deadline(self) -> float:
        return time.monotonic() + self.retry_timeout

    def close(self) -> None:
        """Stops renewing every lease, leadership and session of this client
        (their ``lost`` is set, with a LockLost error) and releases nothing:
        release and close them first to hand them on at once; otherwise they
        expire after their TTL."""
        with self._live_mu:
            self._closed = True
            live = list(self._live)
        for k in live:
            k.end(errors.LockLost("the client was closed", code=""))
        for k in live:
            k.join()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- locks -------------------------------------------------------------

    def lock(self, name: str, ttl: float = 30.0, *, wait: Optional[float] = None,
             session: Optional[Session] = None, takeover: bool = False) -> Lease:
        """Takes the lock called name, for ``with``:

            with client.lock("billing/job", ttl=30) as lease:
                store.write(data, token=lease.token)

        Waits in the lock's FIFO queue until granted (``wait=None``, the
        default), for at most ``wait`` seconds (then WaitTimeout), or not at
        all (``wait=0``: LockHeld if someone has it). The lease renews itself
        at ttl/3; ``lease.lost`` is set the moment it may be lost. Leaving the
        block releases the lock, and raises LockLost if the lease was lost
        while the block ran. ``session`` holds it under a session instead of
        a lease of its own; ``takeover`` takes it at once from another lease
        of this client_id (docs/api.md, Takeover)."""
        return self.acquire(name, ttl, wait=wait, session=session, takeover=takeover)

    def acquire(self, name: str, ttl: float = 30.0, *, wait: Optional[float] = None,
                session: Optional[Session] = None, takeover: bool = False) -> Lease:
        """lock() without the ``with``: call lease.release() when done."""
        self._check_open()
        path = "/locks/" + escape_name(name)
        name = name.lstrip("/")
        ttl_ms = 0 if session is not None else check_ttl(ttl)
        if wait is not None and not 0 <= wait:
            raise errors.InvalidArgument(f"wait {wait:g}: use None (wait as long as it takes), 0 (do not wait) or seconds")

        def body(rid: str, wait_ms: int, take: bool) -> Dict[str, Any]:
            b: Dict[str, Any] = {"client_id": self.client_id, "request_id": rid}
            if session is not None:
                b["session_id"] = session.id
            else:
                b["ttl_ms"] = ttl_ms
            if wait_ms > 0:
                b["wait_timeout_ms"] = wait_ms
            if take:
                b["takeover"] = True
            return b

        def send(rid: str, wait_ms: int, deadline: Optional[float], progress: Dict[str, Any]) -> Tuple[Grant, float]:
            sent, ans = self._t.call("POST", path + "/acquire", body(rid, wait_ms, takeover), request_id=rid,
                                     attempt_timeout=self.request_timeout + wait_ms / 1000, deadline=deadline,
                                     what=f"acquire {name!r}", progress=progress)
            if not isinstance(ans, dict) or not ans.get("acquired") or not ans.get("fencing_token"):
                raise errors.DlockError(f"acquire {name!r}: the server answered 2xx without a grant")
            return Grant(name, self.client_id, ans), sent if sent is not None else time.monotonic()

        def withdraw(rid: str) -> None:
            # The repeat is answered from the cluster's record of rid: a wait
            # still in line ends at once, a grant made meanwhile comes back.
            try:
                sent, ans = self._t.call("POST", path + "/acquire", body(rid, 0, False), request_id=rid,
                                         deadline=time.monotonic() + CLEANUP_TIMEOUT, what=f"withdraw acquire {name!r}")
            except (errors.LockHeld, errors.LockLost):
                return
            except errors.DlockError as e:
                log.warning("dlock: could not withdraw an abandoned acquire of %s; the server drops it at its wait timeout or TTL: %s", name, e)
                return
            if isinstance(ans, dict) and ans.get("acquired"):
                give_back(Grant(name, self.client_id, ans))

        def give_back(g: Grant) -> None:
            try:
                self._release(name, g.fencing_token, g.lease_id, deadline=time.monotonic() + CLEANUP_TIMEOUT)
            except errors.NotHolder:
                pass
            except errors.DlockError as e:
                log.warning("dlock: could not give back an unused grant of %s; it expires after its TTL: %s", name, e)

        def renew(g: Grant, deadline: float) -> float:
            sent, _ = self._renew(name, g.fencing_token, g.lease_id, deadline=deadline,
                                  attempt_timeout=min(max(ttl / 3, 0.5), self.request_timeout))
            return sent

        g, sent = _wait_in_line(self, "lock", name, ttl if session is None else 0.0, wait, session, send, withdraw, give_back, renew)
        keeper = self._lease_keeper(f"lock {name}", ttl, sent, session,
                                    lambda bound: self._renew(name, g.fencing_token, g.lease_id, deadline=bound,
                                                              attempt_timeout=keeper.attempt_timeout())[0])
        try:
            self._track(keeper)
        except errors.ClientClosed:
            give_back(g)
            raise
        keeper.start()
        return Lease(self, g, keeper)

    def _lease_keeper(self, what: str, ttl: float, sent: float, session: Optional[Session], renew: Any) -> Keeper:
        if session is not None:
            return Keeper(what, session.ttl, sent, parent=session._keeper)
        return Keeper(what, ttl, sent, renew=renew, attempt_timeout=self.request_timeout)

    def _release(self, name: str, token: int, lease_id: str, deadline: Optional[float] = None) -> None:
        rid = new_request_id()
        self._t.call("POST", f"/locks/{escape_name(name)}/release",
                     {"client_id": self.client_id, "fencing_token": token, "lease_id": lease_id, "request_id": rid},
                     request_id=rid, deadline=deadline or self._deadline(), what=f"release {name!r}")

    def _renew(self, name: str, token: int, lease_id: str, *, deadline: float,
               attempt_timeout: Optional[float] = None, ttl: float = 0) -> Tuple[float, Dict[str, Any]]:
        rid = new_request_id()
        body: Dict[str, Any] = {"client_id": self.client_id, "fencing_token": token, "lease_id": lease_id, "request_id": rid}
        if ttl:
            body["ttl_ms"] = check_ttl(ttl)
        sent, ans = self._t.call("POST", f"/locks/{escape_name(name)}/renew", body, request_id=rid,
                                 attempt_timeout=attempt_timeout, deadline=deadline, what=f"renew {name!r}")
        return (sent if sent is not None else time.monotonic()), ans

    def get_lock(self, name: str, *, stale: bool = False) -> Dict[str, Any]:
        """One lock's state (a linearizable read unless stale):
        ``{"name", "held", "holder"?, "waiters", "revision"}``."""
        q = "?stale=true" if stale else ""
        _, ans = self._t.call("GET", "/locks/" + escape_name(name) + q, deadline=self._deadline())
        return ans

    def list_locks(self, prefix: str = "") -> Tuple[List[Dict[str, Any]], int]:
        """The locks under prefix that are held or waited for, in name order,
        and the revision of the (first) read: watch from revision + 1 to see
        every later change exactly once."""
        out: List[Dict[str, Any]] = []
        rev, after = 0, ""
        while True:
            q = {"limit": "10000"}
            if prefix:
                q["prefix"] = prefix
            if after:
                q["after"] = after
            _, ans = self._t.call("GET", "/locks?" + urlencode(q), deadline=self._deadline())
            rev = rev or int(ans["revision"])
            out.extend(ans["locks"])
            if not ans.get("more") or not ans["locks"]:
                return out, rev
            after = ans["locks"][-1]["name"]

    def cluster(self, *, health: bool = False) -> Dict[str, Any]:
        """A node's view of the cluster: members, leader, revision."""
        _, ans = self._t.call("GET", "/cluster" + ("?health=true" if health else ""), deadline=self._deadline())
        return ans

    def token_keys(self) -> Dict[str, Any]:
        """The cluster's key-set document (dlock.fence.KeySet.parse reads it)."""
        _, ans = self._t.call("GET", "/cluster/token-key", deadline=self._deadline())
        return ans

    # -- sessions ------------------------------------------------------------

    def session(self, ttl: float = 30.0) -> Session:
        """Creates a session that the client keeps alive every ttl/3 until
        closed (use it with ``with``, or call close())."""
        self._check_open()
        ttl_ms = check_ttl(ttl)
        rid = new_request_id()
        sent, ans = self._t.call("POST", "/sessions", {"client_id": self.client_id, "ttl_ms": ttl_ms, "request_id": rid},
                                 request_id=rid, deadline=self._deadline(), what="create session")
        return Session(self, str(ans["session_id"]), ttl, sent if sent is not None else time.monotonic())

    # -- elections and watches (election.py, watch.py) ---------------------------

    def election(self, name: str, ttl: float = 30.0, *, session: Optional[Session] = None) -> "Election":
        """The election called name (its own namespace, apart from locks)."""
        from .election import Election
        return Election(self, name, ttl, session)

    def watch(self, prefix: str = "", from_revision: int = 0) -> "Watch":
        """Every state change under prefix from from_revision on (0: from
        now), in revision order, as an iterator of event dicts; it resumes on
        another node when one fails, without losing or repeating an event.
        Close it (or use ``with``) to stop."""
        from .watch import Watch
        return Watch(self, prefix, from_revision)


def _wait_in_line(client: Client, what: str, name: str, ttl: float, wait: Optional[float],
                  session: Optional[Session], send: Any, withdraw: Any, give_back: Any,
                  renew: Any) -> Tuple[Grant, float]:
    """Asks for the seat until it is granted, the wait runs out, or the
    session ends, and leaves nothing behind when it does not return a grant:
    a wait that may have reached a node is withdrawn, a seat won too late is
    given back. Returns the grant and the moment its lease's bound counts
    from (a send time, never later than the grant)."""
    until = None if wait is None else time.monotonic() + wait
    backoff = BACKOFF_MIN
    while True:
        if session is not None and session.lost.is_set():
            raise errors.SessionExpired(f"{what} {name!r}: the session ended: {session.error}")
        rid = new_request_id()
        wait_ms = 0
        if wait is None:
            wait_ms = int(MAX_WAIT * 1000)  # the server's limit; then queue again
        elif wait > 0:
            # Less than the time left, so the server says wait_timeout
            # before this client gives up on the request.
            left = until - time.monotonic()
            left -= min(left / 10, WAIT_MARGIN)
            wait_ms = max(1, min(int(left * 1000), int(MAX_WAIT * 1000)))
        # An unreachable cluster: give up retry_timeout after the wait would
        # have ended (never, when waiting as long as it takes).
        deadline = None if until is None else max(until, time.monotonic()) + client.retry_timeout
        progress: Dict[str, Any] = {}
        asked = time.monotonic()
        try:
            g, sent = send(rid, wait_ms, deadline, progress)
        except errors.WaitTimeout:
            if wait != 0 and (until is None or until - time.monotonic() > WAIT_MARGIN
                              or time.monotonic() - asked < wait_ms / 1000 * 0.9):
                # The server's one-hour limit, or a node that withdrew early:
                # the caller's wait is not over.
                time.sleep(jitter(backoff))
                backoff = min(2 * backoff, BACKOFF_MAX)
                continue
            raise
        except errors.LockLost as e:
            if e.code != "lock_lost":
                raise
            # Granted to an earlier attempt and lapsed before we heard of
            # it (a retry across a failover): ask again.
            time.sleep(jitter(backoff))
            backoff = min(2 * backoff, BACKOFF_MAX)
            continue
        except errors.DlockError as e:
            if isinstance(e, errors.Unavailable) and e.sent is not None:
                # Given up on an unreachable cluster: a wait that reached a
                # node must not be granted to nobody.
                withdraw(rid)
            raise  # refused (LockHeld, InvalidArgument, …): nothing to undo
        except BaseException:  # KeyboardInterrupt, SystemExit, ...
            if progress.get("sent") is not None or progress.get("maybe") is not None:
                withdraw(rid)
            raise
        if session is not None and session.lost.is_set():
            give_back(g)
            raise errors.SessionExpired(f"{what} {name!r}: the session ended: {session.error}")
        if session is None and time.monotonic() - sent > ttl / 3:
            # The grant's send time is old (a wait in line, slow retries), so
            # the bound it gives is short or past: renew for a fresh one
            # before handing the seat out.
            try:
                sent = renew(g, time.monotonic() + ttl)
            except errors.DlockError as e:
                give_back(g)
                if wait == 0:
                    raise errors.LockLost(f"{what} {name!r}: confirming a slow grant: {e}") from e
                log.debug("dlock: could not confirm a grant of %s; asking again: %s", name, e)
                continue
        return g, sent
