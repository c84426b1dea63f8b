"""Errors of the dlock client.

Every error a dlock node answers becomes a :class:`DlockError` subclass named
after its code (docs/api.md), so callers branch with ``except``:

    try:
        lease = client.acquire("billing/job", wait=0)
    except dlock.LockHeld as e:
        print("held by", e.holder["client_id"])
"""

from __future__ import annotations

from typing import Any, Dict, Optional


class DlockError(Exception):
    """Base of every dlock error.

    ``code`` is the server's snake_case code ("lock_held"), or "" for an error
    that did not come from a dlock answer; ``status`` the HTTP status (0 if
    none); ``message`` what went wrong and what to do.
    """

    code: str = ""
    #: time.monotonic() when the first attempt that may have reached a node
    #: was sent, None if none may have (set by the client).
    sent: Optional[float] = None

    def __init__(self, message: str, *, code: str = "", status: int = 0,
                 body: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.status = status
        self.body = body or {}

    def __str__(self) -> str:
        if self.code:
            return f"dlock: {self.code}: {self.message}"
        return f"dlock: {self.message}"


class InvalidArgument(DlockError):
    """The request was refused as malformed (bad name, TTL out of range, …);
    retrying it cannot help."""

    code = "invalid_argument"


class NotFound(DlockError):
    """Nothing by that id or path."""

    code = "not_found"


class LockHeld(DlockError):
    """Someone else holds the lock and the call did not wait.

    ``holder`` is who holds it: ``{"client_id", "fencing_token", "granted_at",
    "expires_at"}`` (for an election, its current leader), or None."""

    code = "lock_held"

    @property
    def holder(self) -> Optional[Dict[str, Any]]:
        return self.body.get("holder") or self.body.get("current")


class WaitTimeout(LockHeld):
    """The wait in line ended before the lock was granted. A subclass of
    :class:`LockHeld`: either way someone else has it."""

    code = "wait_timeout"


class LockDelayed(LockHeld):
    """The lock is in a lock-delay: its last grant, which asked for one
    (``lock_delay=``), ended by expiry or revoke, and nobody gets it until
    the delay has passed. Only an acquire that does not wait (``wait=0``)
    gets it; one that waits keeps its place in line and is granted when the
    delay ends. A subclass of :class:`LockHeld`: either way the lock cannot
    be had now.

    ``retry_after`` is the seconds the delay has left."""

    code = "lock_delayed"

    @property
    def retry_after(self) -> float:
        err = self.body.get("error")
        ms = err.get("retry_after_ms", 0) if isinstance(err, dict) else 0
        return (ms if isinstance(ms, (int, float)) else 0) / 1000


class LimitMismatch(DlockError):
    """The lock is in use with another ``limit`` than the one asked for (a
    semaphore's, or 1 for a plain or shared lock). The first acquire of an
    unused lock sets its limit; every user of the lock must ask for the same
    one. Nothing changed.

    ``limit`` is the lock's limit."""

    code = "limit_mismatch"

    @property
    def limit(self) -> Optional[int]:
        v = self.body.get("limit")
        return v if isinstance(v, int) else None


class LockLost(DlockError):
    """This client does not hold the lock (any more).

    Raised by :meth:`Lease.check` and at the end of a ``with client.lock(...)``
    block once the lease was lost (``lease.lost`` is set), and for the
    server's ``lock_lost`` answer: an acquire that was granted but whose grant
    ended before the answer reached the client (``fencing_token`` is that
    grant's), which :meth:`Client.acquire` handles by asking again; or a
    renewal of a grant an operator revoked (:meth:`Client.revoke`), which
    ends the lease with this error."""

    code = "lock_lost"

    @property
    def fencing_token(self) -> Optional[int]:
        return self.body.get("fencing_token")


class NotHolder(LockLost):
    """A release or renew named a token and lease that do not hold the lock
    (it expired, was released, or was never yours)."""

    code = "not_holder"


class SessionExpired(LockLost):
    """The server no longer knows the session (it expired, was deleted, or
    belongs to another client id)."""

    code = "session_not_found"


class Compacted(DlockError):
    """A watch asked for revisions the node no longer keeps (the last 10,000
    events). List again and watch from the listed revision + 1."""

    code = "compacted"


class Unavailable(DlockError):
    """No node could complete the request in time (nodes down, no leader,
    a full disk). The client already retried; try again later."""

    code = "unavailable"


class NoLeader(Unavailable):
    """The cluster has no leader (an election is under way, or a quorum is
    down)."""

    code = "no_leader"


class Unauthenticated(DlockError):
    """The cluster runs with ACLs and the request had no valid token."""

    code = "unauthenticated"


class PermissionDenied(DlockError):
    """The token does not allow this on this name or client id."""

    code = "permission_denied"


class TooLarge(InvalidArgument):
    """The request body is over 64 KiB."""

    code = "too_large"


class RateLimited(Unavailable):
    """Too many requests from this client."""

    code = "rate_limited"


class ClientClosed(DlockError):
    """The :class:`Client` was closed."""


_BY_CODE = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, LockHeld, WaitTimeout, LockDelayed, LimitMismatch, LockLost, NotHolder,
                SessionExpired, Compacted, Unavailable, NoLeader, Unauthenticated,
                PermissionDenied, TooLarge, RateLimited)
}
_BY_CODE["disk_full"] = Unavailable
_BY_CODE["wrong_shard"] = Unavailable
_BY_CODE["conflict"] = InvalidArgument


def from_answer(status: int, body: Any, fallback: str = "") -> DlockError:
    """The error for an error answer of a dlock node (or of whatever answered
    in its place, such as a proxy's error page)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        code = str(e.get("code", ""))
        cls = _BY_CODE.get(code, DlockError)
        return cls(str(e.get("message", code)), code=code, status=status, body=body)
    text = fallback.strip()
    if len(text) > 200:
        text = text[:200] + "…"
    cls = Unavailable if status in (502, 503, 504) else DlockError
    return cls(f"HTTP {status}: {text}", code="" if cls is DlockError else cls.code, status=status)
