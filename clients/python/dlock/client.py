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
#: The server's limits on a counting lock's limit, a holder's value (bytes,
#: UTF-8), a lock-delay (seconds) and a revoke's reason (bytes).
MAX_LIMIT, MAX_VALUE, MAX_LOCK_DELAY, MAX_REASON = 10_000, 4096, 60.0, 256


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


def check_value(value: str) -> None:
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"value must be a str, not {type(value).__name__}")
    n = len(value.encode("utf-8"))
    if n > MAX_VALUE:
        raise errors.InvalidArgument(f"value is {n} bytes; the limit is {MAX_VALUE}")


def _kind(limit: int, shared: bool, subtree: bool, value: Optional[str], lock_delay: float) -> Dict[str, Any]:
    """The acquire fields beyond the name that choose the kind of grant
    (docs/api.md, Counting, shared and subtree locks), checked as the server
    would, so a bad call fails at once."""
    k: Dict[str, Any] = {}
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidArgument(f"limit {limit!r}: use a whole number from 1 to {MAX_LIMIT}")
    if limit > 1:
        k["limit"] = limit
    if shared:
        if limit > 1:
            raise errors.InvalidArgument("a counting lock (limit above 1) is exclusive only: shared grants need limit 1")
        k["mode"] = "shared"
    if subtree:
        k["subtree"] = True
    if value is not None:
        check_value(value)
        if value:
            k["value"] = value
    if lock_delay:
        if not 0 <= lock_delay <= MAX_LOCK_DELAY:
            raise errors.InvalidArgument(f"lock_delay {lock_delay:g} s: use 0 to {MAX_LOCK_DELAY:g} seconds")
        k["lock_delay_ms"] = round(lock_delay * 1000)
    return k


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
        client may hold it. An operator's revoke (:meth:`Client.revoke`) is
        the one exception: the server hands the lock on at once, and this
        client learns of it at its next renewal (at most ttl/3 later; the
        renewal is answered ``lock_lost``, and ``error`` says so); under a
        session, at the session's next keepalive, whose answer lists the
        grants the session lost (a takeover by another lease of this client
        id too: ``error`` is then a NotHolder). Fencing tokens cover the gap."""
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

    def set_value(self, value: str) -> None:
        """Replaces the value this holder shows in get_lock, list_locks,
        watch events (``value_changed``) and the history (at most 4 KiB;
        "" clears it). It is sent as a renewal, so it also extends the lease.
        Raises LockLost, and sets ``lost``, if the server no longer counts
        this client as the holder (NotHolder; ``lock_lost`` after a
        revoke)."""
        self.check()
        check_value(value)
        try:
            sent, _ = self._client._renew(self.name, self.token, self.lease_id,
                                          deadline=self._client._deadline(), value=value)
        except errors.LockLost as e:
            self._keeper.end(errors.LockLost(f"lock {self.name} lost: {e}", code=e.code, status=e.status, body=e.body))
            raise
        self._keeper.extend(sent)

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

        # The revision up to which the keepalives have listed the grants the
        # session lost (docs/api.md, "Lost grants"); the keeper's thread's.
        self._lost_after = 0

        def renew(bound: float) -> float:
            rid = new_request_id()
            body: Dict[str, Any] = {"client_id": client.client_id, "request_id": rid}
            if self._lost_after:
                body["lost_after"] = self._lost_after
            sent, ans = client._t.call("POST", self._path() + "/keepalive", body,
                                       request_id=rid, attempt_timeout=self._keeper.attempt_timeout(), deadline=bound,
                                       what="POST /sessions/{id}/keepalive")
            self._heard(ans or {})
            return sent if sent is not None else time.monotonic()

        self._keeper = Keeper("session", ttl, sent, renew=renew, attempt_timeout=client.request_timeout)
        client._track(self._keeper)
        self._keeper.start()

    def _path(self) -> str:
        return "/sessions/" + quote(self._id, safe="")

    def _heard(self, ans: Dict[str, Any]) -> None:
        """Ends the grants a keepalive answer lists as lost: revoked by an
        operator (LockLost, code lock_lost) or taken over by another lease of
        this client id (NotHolder)."""
        for g in ans.get("lost") or []:
            token, name, kind = int(g["fencing_token"]), str(g.get("name", "")), str(g.get("kind", "lock"))
            if g.get("cause") == "revoked":
                reason = f" (reason: {g['reason']!r})" if g.get("reason") else ""
                err: BaseException = errors.LockLost(
                    f"{kind} {name!r}: the grant with fencing token {token} was revoked by an operator{reason}; "
                    "stop using the resource and acquire again", status=409, body={"fencing_token": token})
            else:
                err = errors.NotHolder(f"{kind} {name!r}: the grant with fencing token {token} ended under this session "
                                       f"({g.get('cause')}); stop using the resource", status=409)
            self._keeper.lost_grant(token, err)
            self._lost_after = max(self._lost_after, int(g.get("revision", 0)))
        self._lost_after = max(self._lost_after, int(ans.get("revision", 0)))

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


class Semaphore:
    """A counting lock: up to ``limit`` holders at once, each with its own
    lease and fencing token, granted in FIFO order (``client.semaphore``).

        deploys = client.semaphore("deploys", 3, ttl=30)
        with deploys as lease:               # waits for one of the 3 places
            deploy(fencing_token=lease.token)

    Every user of the lock must ask for the same limit: the first acquire of
    an unused lock sets it, and an acquire with another one fails with
    LimitMismatch. Each acquire takes one more place, also from one thread
    or one Client (there is no local exclusion).
    """

    def __init__(self, client: "Client", name: str, limit: int, ttl: float, *, session: Optional[Session],
                 subtree: bool, takeover: bool, value: Optional[str]) -> None:
        self._client = client
        self.name = name.lstrip("/")
        escape_name(name)
        self.limit = limit
        self.ttl = ttl
        self._session = session
        self._takeover = takeover
        self._kind = _kind(limit, False, subtree, value, 0.0)
        if session is None:
            check_ttl(ttl)
        self._held = threading.local()

    def acquire(self, wait: Optional[float] = None) -> Lease:
        """Waits for one of the places (``wait`` as for Client.lock: None
        as long as it takes, 0 not at all, else seconds). The lease renews
        itself until released; release it with ``release(lease)`` or
        ``lease.release()``, or use it with ``with``."""
        return self._client._acquire(self.name, self.ttl, wait=wait, session=self._session,
                                     takeover=self._takeover, kind=self._kind)

    def release(self, lease: Lease) -> None:
        """Gives a place back (the next in line gets it at once), as
        lease.release()."""
        if lease.name != self.name:
            raise errors.InvalidArgument(f"semaphore {self.name!r}: release of a lease of {lease.name!r}")
        lease.release()

    def __enter__(self) -> Lease:
        lease = self.acquire()
        stack = getattr(self._held, "stack", None)
        if stack is None:
            stack = self._held.stack = []
        stack.append(lease)
        return lease

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._held.stack.pop().__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<dlock.Semaphore {self.name!r} limit={self.limit}>"


class RWLock:
    """A shared/exclusive (readers/writer) lock (``client.rwlock``): any
    number of readers hold it together, a writer holds it alone.

        config = client.rwlock("config/main", ttl=30)
        with config.read() as lease:         # a shared grant
            load(fencing_token=lease.token)
        with config.write() as lease:        # the exclusive grant
            store(fencing_token=lease.token)

    Grants are FIFO: a writer waiting in line keeps out the readers that come
    after it (writers are not starved), and readers next to each other at the
    head of the line are let in together. Every read() is a grant of its own
    (its own lease and token). With ``subtree=True`` every grant covers the
    names below the lock too (a shared subtree grant keeps out writers inside
    the subtree, not readers).
    """

    def __init__(self, client: "Client", name: str, ttl: float, *, session: Optional[Session],
                 subtree: bool, takeover: bool) -> None:
        self._client = client
        self.name = name.lstrip("/")
        escape_name(name)
        self.ttl = ttl
        self._session = session
        self._subtree = subtree
        self._takeover = takeover
        if session is None:
            check_ttl(ttl)

    def read(self, wait: Optional[float] = None, *, value: Optional[str] = None) -> Lease:
        """Waits for a shared grant (``wait`` as for Client.lock)."""
        return self._client._acquire(self.name, self.ttl, wait=wait, session=self._session, takeover=self._takeover,
                                     kind=_kind(1, True, self._subtree, value, 0.0))

    def write(self, wait: Optional[float] = None, *, value: Optional[str] = None) -> Lease:
        """Waits for the exclusive grant (``wait`` as for Client.lock)."""
        return self._client._acquire(self.name, self.ttl, wait=wait, session=self._session, takeover=self._takeover,
                                     kind=_kind(1, False, self._subtree, value, 0.0))

    def __repr__(self) -> str:
        return f"<dlock.RWLock {self.name!r}>"


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
             session: Optional[Session] = None, takeover: bool = False, shared: bool = False,
             subtree: bool = False, value: Optional[str] = None, lock_delay: float = 0.0) -> Lease:
        """Takes the lock called name, for ``with``:

            with client.lock("billing/job", ttl=30) as lease:
                store.write(data, token=lease.token)

        Waits in the lock's FIFO queue until granted (``wait=None``, the
        default), for at most ``wait`` seconds (then WaitTimeout), or not at
        all (``wait=0``: LockHeld if someone has it, LockDelayed in a
        lock-delay). The lease renews itself at ttl/3; ``lease.lost`` is set
        the moment it may be lost. Leaving the block releases the lock, and
        raises LockLost if the lease was lost while the block ran.
        ``session`` holds it under a session instead of a lease of its own;
        ``takeover`` takes it at once from another lease of this client_id
        (docs/api.md, Takeover).

        ``shared=True`` asks for a shared grant: shared holders coexist, an
        exclusive one holds the lock alone (see :meth:`rwlock`).
        ``subtree=True`` makes the grant cover the name and every name below
        it ("billing" covers "billing/job-A", not "billing2").
        ``value`` (at most 4 KiB) is shown by get_lock, list_locks, watch
        events and the history while this client holds the lock
        (``lease.set_value`` replaces it). ``lock_delay`` (0 to 60 seconds)
        keeps the lock from everyone for that long after this grant ends by
        expiry or revoke — never after a release — for resources that cannot
        check fencing tokens."""
        return self.acquire(name, ttl, wait=wait, session=session, takeover=takeover, shared=shared,
                            subtree=subtree, value=value, lock_delay=lock_delay)

    def acquire(self, name: str, ttl: float = 30.0, *, wait: Optional[float] = None,
                session: Optional[Session] = None, takeover: bool = False, shared: bool = False,
                subtree: bool = False, value: Optional[str] = None, lock_delay: float = 0.0) -> Lease:
        """lock() without the ``with``: call lease.release() when done."""
        return self._acquire(name, ttl, wait=wait, session=session, takeover=takeover,
                             kind=_kind(1, shared, subtree, value, lock_delay))

    def _acquire(self, name: str, ttl: float, *, wait: Optional[float], session: Optional[Session],
                 takeover: bool, kind: Dict[str, Any]) -> Lease:
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
            b.update(kind)
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
                                                              attempt_timeout=keeper.attempt_timeout())[0],
                                    g.fencing_token)
        try:
            self._track(keeper)
        except errors.ClientClosed:
            give_back(g)
            raise
        keeper.start()
        return Lease(self, g, keeper)

    def _lease_keeper(self, what: str, ttl: float, sent: float, session: Optional[Session], renew: Any,
                      token: int) -> Keeper:
        if session is not None:
            k = Keeper(what, session.ttl, sent, parent=session._keeper)
            k.token = token  # a keepalive that lists it as lost ends it
            return k
        return Keeper(what, ttl, sent, renew=renew, attempt_timeout=self.request_timeout)

    def _release(self, name: str, token: int, lease_id: str, deadline: Optional[float] = None) -> None:
        rid = new_request_id()
        self._t.call("POST", f"/locks/{escape_name(name)}/release",
                     {"client_id": self.client_id, "fencing_token": token, "lease_id": lease_id, "request_id": rid},
                     request_id=rid, deadline=deadline or self._deadline(), what=f"release {name!r}")

    def _renew(self, name: str, token: int, lease_id: str, *, deadline: float,
               attempt_timeout: Optional[float] = None, ttl: float = 0,
               value: Optional[str] = None) -> Tuple[float, Dict[str, Any]]:
        rid = new_request_id()
        body: Dict[str, Any] = {"client_id": self.client_id, "fencing_token": token, "lease_id": lease_id, "request_id": rid}
        if ttl:
            body["ttl_ms"] = check_ttl(ttl)
        if value is not None:
            body["value"] = value
        sent, ans = self._t.call("POST", f"/locks/{escape_name(name)}/renew", body, request_id=rid,
                                 attempt_timeout=attempt_timeout, deadline=deadline, what=f"renew {name!r}")
        return (sent if sent is not None else time.monotonic()), ans

    def semaphore(self, name: str, limit: int, ttl: float = 30.0, *, session: Optional[Session] = None,
                  subtree: bool = False, takeover: bool = False, value: Optional[str] = None) -> Semaphore:
        """A counting lock called name that admits up to limit holders (1 to
        10000) at once: ``with client.semaphore("deploys", 3) as lease:``
        waits for one of the places, or call its acquire() and release().
        The options apply to every place, as for lock()."""
        self._check_open()
        return Semaphore(self, name, limit, ttl, session=session, subtree=subtree, takeover=takeover, value=value)

    def rwlock(self, name: str, ttl: float = 30.0, *, session: Optional[Session] = None,
               subtree: bool = False, takeover: bool = False) -> RWLock:
        """A readers/writer lock called name: ``read()`` takes a shared
        grant, ``write()`` the exclusive one (each a Lease, for ``with``).
        The same as ``lock(name, shared=True)`` and ``lock(name)``."""
        self._check_open()
        return RWLock(self, name, ttl, session=session, subtree=subtree, takeover=takeover)

    def history(self, name: str, *, limit: Optional[int] = None, election: bool = False,
                stale: bool = False) -> Dict[str, Any]:
        """The recent grants of the lock (or, with ``election``, the
        election) called name, newest first: ``{"name", "revision",
        "grants": [{"fencing_token", "client_id", "value"?, "granted_at",
        "ended_at"?, "end_cause"?, "reason"?, "ttl_ms", "lock_delay_ms"?}]}``.
        The grants that hold it now come first (no ``end_cause``), then
        those that ended, with ``end_cause`` released, expired,
        session_deleted, revoked (with the operator's ``reason``),
        taken_over or resigned. ``limit``: at most that many (default: all
        the cluster keeps). A linearizable read unless stale."""
        q: Dict[str, str] = {}
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise errors.InvalidArgument(f"history limit {limit!r}: use a positive whole number, or None for all")
            q["limit"] = str(limit)
        if election:
            q["kind"] = "election"
        if stale:
            q["stale"] = "true"
        path = "/history/" + escape_name(name) + ("?" + urlencode(q) if q else "")
        _, ans = self._t.call("GET", path, deadline=self._deadline(), what=f"history of {name!r}")
        return ans

    def revoke(self, name: str, token: Optional[int] = None, *, reason: str, election: bool = False) -> List[int]:
        """Ends the grant of the lock called name whose fencing token is
        token (None: every grant that holds it) without its holder's
        consent, and returns the tokens it revoked. The next waiter gets the
        lock at once with a higher token (after the grant's lock-delay, if
        it set one); ``reason`` (1 to 256 bytes, required) goes into the
        history and the watch event; the holder's next renewal is answered
        ``lock_lost`` (under a session, the session's next keepalive lists
        it as lost) and its ``lease.lost`` is set. The old holder may still
        be running: only fencing protects the resource. NotFound if no such
        grant holds it. With ACLs it needs the revoke permission on the name
        (or admin). ``election`` revokes an election's leader instead."""
        if not isinstance(reason, str) or not reason.strip() or len(reason.encode("utf-8")) > MAX_REASON:
            raise errors.InvalidArgument(f"a revoke needs a reason of 1 to {MAX_REASON} bytes (it is kept in the history)")
        if token is not None and (isinstance(token, bool) or not isinstance(token, int) or token < 1):
            raise errors.InvalidArgument(f"fencing token {token!r}: use a positive whole number, or None for every holder")
        rid = new_request_id()
        body: Dict[str, Any] = {"reason": reason, "client_id": self.client_id, "request_id": rid}
        if token is not None:
            body["fencing_token"] = token
        kind = "elections" if election else "locks"
        _, ans = self._t.call("POST", f"/{kind}/{escape_name(name)}/revoke", body, request_id=rid,
                              deadline=self._deadline(), what=f"revoke {name!r}")
        if ans.get("fencing_token"):
            return [int(ans["fencing_token"])]
        return [int(t) for t in ans.get("fencing_tokens") or []]

    def get_lock(self, name: str, *, stale: bool = False) -> Dict[str, Any]:
        """One lock's state (a linearizable read unless stale):
        ``{"name", "held", "holder"?, "holders", "limit", "mode"?,
        "subtree"?, "value"?, "delayed_until"?, "waiters", "queue"?,
        "revision"}`` (docs/api.md). ``holders`` lists every holder (several
        for a semaphore or shared lock), ``holder`` is the first."""
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
